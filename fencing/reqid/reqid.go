// Package reqid gives every request on fencegate's listeners a request id:
// the client's X-Request-Id when it is usable, a generated one otherwise.
// The id is stored in the request context (read it with
// middleware.GetReqID from chi), echoed in the response's X-Request-Id so a
// client can quote it, and logged beside every error, so a problem report
// and a log line can be matched.
package reqid

import (
	"crypto/rand"
	"net/http"
	"os"
	"strconv"

	"github.com/go-chi/chi/v5/middleware"
)

// Header is the request id header, in requests and responses.
const Header = "X-Request-Id" // chi's middleware.RequestIDHeader default

// MaxBytes bounds a client-supplied id; longer or non-printable ids are
// replaced by a generated one so they cannot bloat or garble logs.
const MaxBytes = 128

// Middleware assigns, stores and echoes the request id.
func Middleware(next http.Handler) http.Handler {
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := middleware.GetReqID(r.Context()); id != "" {
			w.Header().Set(Header, id)
		}
		next.ServeHTTP(w, r)
	})
	assign := middleware.RequestID(echo)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get(Header); id != "" && !sane(id) {
			r.Header.Del(Header)
		}
		assign.ServeHTTP(w, r)
	})
}

// From returns the request's id, or "" outside Middleware.
func From(r *http.Request) string { return middleware.GetReqID(r.Context()) }

func sane(id string) bool {
	if len(id) > MaxBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= 0x20 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// prefix starts the ids Choose generates: this host and process, like the
// ids chi's middleware generates for the lease API.
var prefix = func() string {
	host, err := os.Hostname()
	if host == "" || err != nil {
		host = "localhost"
	}
	return host + "/" + rand.Text()[:10]
}()

// Choose is the id of a request that arrived with client as its
// X-Request-Id (empty when absent), for listeners outside net/http (the
// write gate): client when it is sane, otherwise a new id from the same
// per-process sequence as Middleware's.
func Choose(client []byte) string {
	if len(client) > 0 && sane(string(client)) {
		return string(client)
	}
	n := middleware.NextRequestID()
	var buf [128]byte // on the stack for the usual prefix: one allocation, the string's
	b := append(buf[:0], prefix...)
	b = append(b, '-')
	for d := uint64(100000); d > 1 && n < d; d /= 10 {
		b = append(b, '0')
	}
	return string(strconv.AppendUint(b, n, 10))
}
