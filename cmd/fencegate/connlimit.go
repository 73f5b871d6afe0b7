package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/fencing/problem"
)

// healthReserve is how many connections the lease API accepts beyond its cap.
// They are served only for health checks (other requests get 503
// too-many-connections and the connection is closed), so /livez and
// /readyz keep answering while slow or abusive clients fill the cap.
const healthReserve = 32

// connLimit caps a listener's concurrent connections. The first max are
// served normally. The next healthReserve are marked overflow (see
// overflowHandler). Beyond those, a new connection gets a fixed 503
// problem+json answer, written before its request is read, and is closed
// at once: the process never holds more than max+healthReserve client
// connections, so it cannot run out of file descriptors. (Blocking accept,
// as netutil.LimitListener does, would leave clients and health checks
// waiting in the kernel's backlog with no answer.)
type connLimit struct {
	net.Listener
	max     int64
	reserve int64
	active  atomic.Int64
}

// newConnLimit caps ln at max connections, plus reserve kept for health
// checks.
func newConnLimit(ln net.Listener, max, reserve int) *connLimit {
	return &connLimit{Listener: ln, max: int64(max), reserve: int64(reserve)}
}

// refusal is the answer to a connection beyond the cap and the reserve.
var refusal = problem.TooManyConnections().Response()

func (l *connLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.active.Add(1)
		if n <= l.max+l.reserve {
			return &limitedConn{Conn: c, l: l, overflow: n > l.max}, nil
		}
		l.active.Add(-1)
		// Best effort: a client that already sent its request may see
		// the connection reset instead of the answer.
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(refusal)
		_ = c.Close()
	}
}

// limitedConn is an accepted connection, counted until it is closed.
type limitedConn struct {
	net.Conn
	l        *connLimit
	overflow bool
	once     sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.active.Add(-1) })
	return err
}

// CloseWrite half-closes a TCP connection: net/http uses it for a lingering
// close after an answer to a request whose body it did not read.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

type overflowKey struct{}

// connContext marks the requests of an overflow connection; it is the
// listener's http.Server.ConnContext.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok && lc.overflow {
		return context.WithValue(ctx, overflowKey{}, true)
	}
	return ctx
}

// overflowHandler serves the requests of overflow connections: those that
// health says yes to go to h (and the connection is then closed), the rest
// get the 503 too-many-connections answer and the connection is closed at
// once, without the lingering close net/http gives a request whose body
// was not read, to free its place.
func overflowHandler(h http.Handler, health func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(overflowKey{}) == nil {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		if health != nil && health(r) {
			h.ServeHTTP(w, r)
			return
		}
		c, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			problem.Write(w, r, nil, problem.TooManyConnections())
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = buf.Write(refusal)
		_ = buf.Flush()
		_ = c.Close()
	})
}

// isHealthCheck says whether r is a liveness or readiness probe.
func isHealthCheck(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/livez" || r.URL.Path == "/readyz")
}
