package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
)

// The general engine's pooled HTTP/1 connections, checked as they are
// reused. An upstream closes an idle keep-alive connection on its own
// schedule (nginx's keepalive_timeout, net/http's IdleTimeout); net/http's
// transport learns of the close only when its reading goroutine runs, so a
// request that comes within that moment was written onto a connection the
// upstream had already closed, and failed as a write that "may have been
// applied": a 502 for a write the upstream never got, and the barrier held
// for the grace against the next holder.
//
// staleConnCheck closes that window the way the event loops' pass does:
// when the transport hands a request a pooled connection (GotConn), one
// non-blocking look at its socket (peerClosed) tells whether the upstream
// has closed it (end of stream, a reset, or bytes no request asked for).
// Such a connection is closed at once, before the transport has written a
// byte on it, and the request goes again on another connection: nothing of
// it was sent, so sending it again cannot apply it twice. A request that
// cannot go again (its streamed body already read from, or the pool found
// stale more times than it holds connections) fails with errStaleConn,
// which notSent counts as never sent.
//
// The check costs one system call a reused connection, on the general
// engine only (the event loops read their connections' state themselves);
// an HTTP/2 upstream is not checked (its transport has its own way with
// connections the upstream went away from).
type staleConnCheck struct {
	next  http.RoundTripper
	tries int // attempts at most: one more than the pool's connections
}

// errStaleConn says that a request was not sent: every connection the
// transport gave it was found closed by the upstream, and closed before a
// byte was written (see staleConnCheck).
var errStaleConn = errors.New("proxy: the upstream had closed the pooled connection; nothing was sent")

// RoundTrip sends req through the HTTP/1 transport it wraps, with the
// exchange's replay as its GetBody: net/http's HTTP/1 transport resends a
// write with one only when it wrote nothing of it on a reused connection
// (and a read, as ever, when the connection failed before the answer).
func (c staleConnCheck) RoundTrip(req *http.Request) (*http.Response, error) {
	if x, ok := req.Context().Value(exchangeKey{}).(*exchange); ok && x.replay != nil {
		r := *req // shallow, as Request.WithContext
		r.GetBody = x.replay
		req = &r
	}
	for try := 1; ; try++ {
		var a connAttempt
		resp, err := c.next.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(),
			&httptrace.ClientTrace{GotConn: a.gotConn})))
		if err == nil || !a.stale.Load() {
			return resp, err
		}
		if try == c.tries {
			return nil, fmt.Errorf("%w: %w", errStaleConn, err)
		}
		if req.Body != nil && req.Body != http.NoBody {
			if req.GetBody == nil {
				return nil, fmt.Errorf("%w: %w", errStaleConn, err)
			}
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, fmt.Errorf("%w: %w", errStaleConn, gerr)
			}
			req = req.Clone(req.Context())
			req.Body = body
		}
	}
}

// connAttempt is one attempt's look at the connection the transport gave
// it; stale is set when that connection was found closed by the upstream
// and was closed before the transport wrote on it.
type connAttempt struct{ stale atomic.Bool }

// gotConn runs as the transport hands the request its connection, before
// it writes anything on it (net/http's HTTP/1 transport calls GotConn
// first); the last call is the connection the attempt went on.
func (a *connAttempt) gotConn(info httptrace.GotConnInfo) {
	a.stale.Store(false)
	if !info.Reused && !info.WasIdle {
		return // dialled for this request
	}
	raw := info.Conn
	if nc, ok := raw.(interface{ NetConn() net.Conn }); ok {
		raw = nc.NetConn() // TLS: the socket under it, closed without a close_notify
	}
	if peerClosed(raw) {
		a.stale.Store(true)
		_ = raw.Close()
	}
}

// replayableBody is a streamed request body handed to the transport one
// attempt at a time: GetBody gives the next attempt the same body as long
// as the transport has not read from the last one. An attempt given up is
// over: a read from it afterwards (a transport's goroutine late to find its
// connection closed) fails and takes nothing from the body.
type replayableBody struct {
	body io.Reader
	cur  atomic.Pointer[bodyAttempt]
}

// bodyAttempt is the body as one attempt reads it. state: 0 untouched, 1
// read from (for good), 2 given up.
type bodyAttempt struct {
	body  io.Reader
	state atomic.Int32
}

var errAttemptOver = errors.New("proxy: a given-up attempt read the request body")

func newReplayableBody(body io.Reader) *replayableBody {
	r := &replayableBody{body: body}
	r.cur.Store(&bodyAttempt{body: body})
	return r
}

// first is the body for the first attempt.
func (r *replayableBody) first() io.ReadCloser { return io.NopCloser(r.cur.Load()) }

// again is the request's GetBody: the body for the next attempt, if the
// last one was never read from (and that one is over), or an error.
func (r *replayableBody) again() (io.ReadCloser, error) {
	last := r.cur.Load()
	if !last.state.CompareAndSwap(0, 2) {
		return nil, errors.New("proxy: the request body was already read from; it cannot be sent again")
	}
	next := &bodyAttempt{body: r.body}
	r.cur.Store(next)
	return io.NopCloser(next), nil
}

func (a *bodyAttempt) Read(p []byte) (int, error) {
	if !a.state.CompareAndSwap(0, 1) && a.state.Load() != 1 {
		return 0, errAttemptOver
	}
	return a.body.Read(p)
}
