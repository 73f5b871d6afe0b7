package proxy

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/fencegate/fencegate/fencing/problem"
)

// bodyReader is a streamed request body as the upstream transport reads
// it. It remembers the first error reading from the client, so a failed
// exchange can be told apart: the client's body (stalled, malformed, cut
// short) or the upstream.
type bodyReader struct {
	r    io.Reader
	left int // bytes still due by the Content-Length; negative: chunked
	err  error
	// whole is set once the body has been read to its end (its
	// Content-Length, or the end of its chunks), read from the answer's
	// side while the transport reads the body (unfinished).
	whole atomic.Bool
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.left >= 0 {
		b.left -= n
		if err == io.EOF && b.left > 0 {
			err = io.ErrUnexpectedEOF // the client's stream ended early
		}
	}
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	if b.left == 0 || err == io.EOF {
		b.whole.Store(true)
	}
	return n, err
}

// unfinished reports whether b (nil: no streamed body) has not yet been
// read to its end.
func (b *bodyReader) unfinished() bool {
	return b != nil && !b.whole.Load()
}

// failure is the first error reading the client's body, or nil (also for a
// nil bodyReader: no body).
func (b *bodyReader) failure() error {
	if b == nil {
		return nil
	}
	return b.err
}

// bodyProblem is the answer to a request whose body failed with err (nil
// for a nil err): 408 body-timeout when it stalled past the body deadline,
// 400 invalid-body when it was malformed or ended early. sent says whether
// the gate had started forwarding it (the upstream then got an incomplete
// request), held whether the barrier is now held for it.
func bodyProblem(err error, sent, held bool) *problem.Error {
	if err == nil {
		return nil
	}
	var p *problem.Error
	if isTimeout(err) {
		p = problem.New(http.StatusRequestTimeout, "body-timeout",
			"the request body did not arrive within the gate's body deadline")
	} else {
		what := "it is malformed, or its connection failed"
		if errors.Is(err, io.ErrUnexpectedEOF) {
			what = "it ended before its declared length"
		}
		p = problem.New(http.StatusBadRequest, "invalid-body", "the request body could not be read ("+what+")")
	}
	if !sent {
		p.Detail += "; nothing was forwarded"
	} else {
		p.Detail += ", so the gate cut the request off; the upstream received an incomplete request, which it should not apply"
	}
	if held {
		p.Detail += ", but one that acts before reading the body may have: the barrier stays closed for this resource for the grace period"
	}
	// The connection's framing or deadline is broken: close it.
	p.Headers = http.Header{"Connection": {"close"}}
	return p
}
