package leaseapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// The headers the write gate reads (proxy.HeaderToken and
// proxy.HeaderResource; a test keeps them equal without making workers
// import the gate).
const (
	tokenHeader    = "Fencing-Token"
	resourceHeader = "Fencing-Resource"
)

// ErrWriteRefused is the error of a fenced request that a session's
// Transport did not send because the session had ended. It wraps the
// session's Err, so it also matches ErrSessionLost or ErrSessionReleased.
// An http.Client returns it inside a *url.Error; errors.Is sees through it.
var ErrWriteRefused = errors.New("leaseapi: session ended, fenced request not sent")

// Transport returns an http.RoundTripper that sends requests through base
// (http.DefaultTransport when nil) on the session's behalf:
//
//   - Safe requests (GET, HEAD, OPTIONS, TRACE) pass through untouched: the
//     gate does not fence them.
//   - Every other request gets the Fencing-Token and Fencing-Resource
//     headers of the session's lease and is sent while the session holds
//     its lease. A token or resource header the caller set, in any case or
//     with underscores, is dropped, and so is any fencing header spelt with
//     underscores (which the gate refuses); a Fencing-Destination-Token
//     the caller sets (a COPY's or MOVE's other resource) goes as set.
//   - Once the session has ended (lost, past its local deadline, or
//     released), such a request is not sent at all: RoundTrip closes its
//     body and returns an error matching ErrWriteRefused, without touching
//     the network.
//
// The check happens when the request starts. A request already on its way
// when the lease is lost, or sent by a process paused just after the check,
// can still arrive late: the gate refuses it (stale-token) once a newer
// token has been admitted. The transport spares the gate and the network
// the requests the worker can know are doomed; the gate is what fences.
func (s *Session) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &fencedTransport{s: s, base: base}
}

type fencedTransport struct {
	s    *Session
	base http.RoundTripper
}

// RoundTrip implements http.RoundTripper. It does not modify req: a fenced
// request is sent as a shallow clone with the fencing headers set.
func (t *fencedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if safeMethod(req.Method) {
		return t.base.RoundTrip(req)
	}
	lease, err := t.s.live()
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper closes the body, even on errors
		}
		return nil, fmt.Errorf("%w: %s %s: %w", ErrWriteRefused, req.Method, req.URL.Redacted(), err)
	}
	out := req.Clone(req.Context())
	for k := range out.Header {
		// The caller's token or resource in any spelling (fencing-token,
		// Fencing_Token), and any fencing header spelt with underscores,
		// which the gate refuses: only the session's go out.
		n := strings.ToLower(strings.ReplaceAll(k, "_", "-"))
		if n == "fencing-token" || n == "fencing-resource" || strings.HasPrefix(n, "fencing-") && strings.Contains(k, "_") {
			delete(out.Header, k)
		}
	}
	out.Header.Set(tokenHeader, lease.Token.String())
	out.Header.Set(resourceHeader, lease.Resource)
	return t.base.RoundTrip(out)
}

// safeMethod reports the methods the gate passes through unfenced, as
// named exactly (methods are case-sensitive); "" is net/http's GET.
func safeMethod(m string) bool {
	switch m {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}
