//go:build linux

package proxy

import (
	"bytes"
	"crypto/tls"
	"net"
	"net/http"
	"os"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/internal/connlimit"
)

// Handing a connection over: a request the loops do not take goes, with its
// connection and the bytes it sent so far, to the general engine, which
// serves the connection from then on and counts it in the engine's table
// (for Shutdown, which waits for it, and Close, which closes it) until it
// closes.

// handOver hands c's connection to the general engine (handoff), and
// reports whether c is still the loop's to move on. Once the server stops,
// the general engine takes no more connections (its Shutdown closed the
// hand-off), so the loop answers the request itself, neither read further
// nor forwarded: 503 draining, Connection: close. (An HTTP/2 client's
// preface gets those bytes too, and fails its connection before any
// stream was sent.)
func (c *loopConn) handOver() bool {
	if c.l.e.closing.Load() {
		c.out = append(c.out, stoppingProblem().Response()...)
		c.enter(stClosing)
		return true
	}
	c.l.handoff(c)
	return false
}

// stoppingProblem answers a request the loops would hand over once the
// server stops.
func stoppingProblem() *problem.Error {
	p := problem.New(http.StatusServiceUnavailable, "draining", "fencegate is shutting down: this request was neither read whole nor forwarded; send it again")
	p.Headers = http.Header{"Retry-After": {"1"}}
	return p
}

// handoff gives c's connection, with the bytes it sent that the loop has
// not consumed, to the general engine (Server.serveHanded), which serves
// it from now on.
func (l *eventLoop) handoff(c *loopConn) {
	l.forget(c)
	c.closed, c.fdClosed = true, true // the loop's part is over: its descriptor is closed below
	if err := l.p.Remove(c.FD); err != nil {
		// Events for the descriptor find no owner in l.fds and are
		// dropped; closing it below removes it from the epoll set.
		l.e.g.log.Debug("gate event loop: could not stop watching a handed-off connection", "error", err)
	}
	f := os.NewFile(uintptr(c.FD), "gate-client")
	nc, err := net.FileConn(f) // a duplicate, in Go's poller
	f.Close()
	if err != nil {
		c.releaseSlot()
		return
	}
	h := &handedConn{pre: bytes.Clone(c.In), e: l.e}
	if c.tls != nil {
		h.remote, h.tls = c.remote, c.tls // the relay's client, not the socket pair
	}
	h.Conn = connlimit.Counted(nc, func() {
		l.e.mu.Lock()
		delete(l.e.handed, h)
		l.e.mu.Unlock()
		c.releaseSlot()
	})
	l.e.mu.Lock()
	l.e.handed[h] = struct{}{}
	l.e.mu.Unlock()
	l.e.goTracked(workHandoff, func() { l.e.s.serveHanded(h) })
}

// handedConn is a client connection handed to the fallback server: it
// reads the bytes the loop took first, and counts against the connection
// cap (and in the engine's table) until it is closed.
type handedConn struct {
	*connlimit.Conn
	pre []byte
	e   *loopEngine
	// For a connection whose TLS a relay terminates: the client's
	// address and TLS, which the socket pair under Conn does not have.
	remote net.Addr
	tls    *tls.ConnectionState
}

// RemoteAddr is the client's address.
func (h *handedConn) RemoteAddr() net.Addr {
	if h.remote != nil {
		return h.remote
	}
	return h.Conn.RemoteAddr()
}

// tlsState is the TLS of a connection a relay terminates, or nil.
func (h *handedConn) tlsState() *tls.ConnectionState { return h.tls }

func (h *handedConn) Read(p []byte) (int, error) {
	if len(h.pre) > 0 {
		n := copy(p, h.pre)
		h.pre = h.pre[n:]
		return n, nil
	}
	return h.Conn.Read(p)
}

// handedConns lists the connections served by the general engine.
func (e *loopEngine) handedConns() []*handedConn {
	e.mu.Lock()
	defer e.mu.Unlock()
	hs := make([]*handedConn, 0, len(e.handed))
	for h := range e.handed {
		hs = append(hs, h)
	}
	return hs
}
