package proxy

import (
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/fencegate/fencegate/fencing/problem"
)

// bodyReader is a forwarded request's body as the transport reads it. It
// remembers the first error reading from the client, so a failed round trip
// can be told apart: the client's body (stalled, malformed, cut short) or
// the upstream. httputil.ReverseProxy hands both to ErrorHandler, and the
// transport reads the body on another goroutine, hence the mutex.
type bodyReader struct {
	io.ReadCloser
	mu  sync.Mutex
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

// failure is the first error reading the client's body, or nil (also for a
// nil bodyReader: no body).
func (b *bodyReader) failure() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// bodyProblem is the answer to a request whose body failed with err while it
// was forwarded (nil for a nil err): 408 body-timeout when it stalled past
// the body deadline, 400 invalid-body when it was malformed or ended early.
// Either way the gate stopped forwarding it mid-way, so the upstream got an
// incomplete request; fenced says whether the barrier is now held.
func bodyProblem(err error, fenced bool) *problem.Error {
	if err == nil {
		return nil
	}
	var p *problem.Error
	if isTimeout(err) {
		p = problem.New(http.StatusRequestTimeout, "body-timeout",
			"the request body did not arrive within the gate's body deadline, so the gate cut the request off")
	} else {
		what := "it is malformed, or its connection failed"
		if errors.Is(err, io.ErrUnexpectedEOF) {
			what = "it ended before its declared length"
		}
		p = problem.New(http.StatusBadRequest, "invalid-body",
			"the request body could not be read ("+what+"), so the gate cut the request off")
	}
	p.Detail += "; the upstream received an incomplete request, which it should not apply"
	if fenced {
		p.Detail += ", but one that acts before reading the body may have: the barrier stays closed for this resource for the grace period"
	}
	// The connection's framing or deadline is broken: close it.
	p.Headers = http.Header{"Connection": {"close"}}
	return p
}
