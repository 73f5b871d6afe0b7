package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

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

// bufferBody reads a request body of at most BodyBuffer bytes in full,
// within BodyTimeout, so it is sent upstream in one piece (x.buffered);
// larger and chunked bodies are left to stream. It returns the problem to
// answer if the body could not be read.
func (g *Gate) bufferBody(x *exchange) *problem.Error {
	if x.bodyErr != nil {
		return bodyProblem(x.bodyErr, false, false)
	}
	if x.r == nil {
		return nil // the event loops read it with the head
	}
	n64 := x.r.ContentLength
	h2 := x.r.ProtoMajor >= 2
	if n64 < 0 || n64 > int64(g.bodyBuffer) || n64 == 0 && !h2 {
		return nil // streamed (chunked, or larger), or none
	}
	n := int(n64)
	g.setBodyDeadline(x)
	buf := bodyBuffers.Get().(*[]byte)
	if cap(*buf) < n {
		// Sized to this body, not to BodyBuffer: a thousand small writes
		// in flight hold a thousand small buffers.
		*buf = make([]byte, 0, max(n, 512))
	}
	_, err := io.ReadFull(x.r.Body, (*buf)[:n])
	if err == nil && h2 {
		err = streamEnd(x.r.Body)
	}
	if err != nil {
		bodyBuffers.Put(buf)
		return bodyProblem(err, false, false)
	}
	*buf = (*buf)[:n]
	x.buffered = buf
	return nil
}

// streamEnd waits for the end of an HTTP/2 request's stream once its
// declared content has been read: a stream that goes on with more DATA is
// malformed (RFC 9113 §8.1.1), which net/http notices only when that DATA
// arrives, after the gate would have forwarded the write (a content-length
// of 0 with DATA after it reached the upstream as an empty write while its
// client got a reset). A stream that ended with its last DATA frame, as
// clients send it, ends at once.
func streamEnd(body io.Reader) error {
	var b [1]byte
	for {
		n, err := body.Read(b[:])
		switch {
		case n > 0:
			return errors.New("http2: the request's DATA goes past its content-length")
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
}

// bodyBuffers recycles the buffers of bodies read in full.
var bodyBuffers = sync.Pool{New: func() any { return new([]byte) }}

// relayBufferPool recycles the general engine's buffers for relayed bodies.
var relayBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// releaseBody returns x's buffered body, if any, to the pool.
func (x *exchange) releaseBody() {
	if x.buffered != nil {
		*x.buffered = (*x.buffered)[:0]
		bodyBuffers.Put(x.buffered)
		x.buffered = nil
	}
}

// setBodyDeadline bounds the time the rest of x's request body may take to
// arrive (Options.BodyTimeout), on the general engine.
func (g *Gate) setBodyDeadline(x *exchange) {
	if err := http.NewResponseController(x.w).SetReadDeadline(time.Now().Add(g.bodyTimeout)); err != nil {
		g.log.LogAttrs(context.Background(), slog.LevelWarn, "cannot bound the request body's read time",
			slog.String("error", err.Error()))
	}
}
