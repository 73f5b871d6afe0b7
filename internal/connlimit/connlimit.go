// Package connlimit caps a server's concurrent client connections without
// blocking its accept loop: a connection beyond the cap and a reserve is
// answered 503 too-many-connections (a problem+json body, before any
// request is read) and closed at once, so the process never holds more
// connections than it allows and cannot run out of file descriptors.
// (Blocking accept, as netutil.LimitListener does, would leave clients
// waiting in the kernel's backlog with no answer.)
package connlimit

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/fencing/problem"
)

// Refusal is the answer written to a connection beyond the cap and the
// reserve.
var Refusal = problem.TooManyConnections().Response()

// Counter counts open connections against a cap, with a reserve beyond
// it. Safe for concurrent use.
type Counter struct {
	max, reserve int64
	active       atomic.Int64
}

// NewCounter returns a counter for max connections (zero or less: no cap)
// plus reserve ones marked overflow.
func NewCounter(max, reserve int) *Counter {
	return &Counter{max: int64(max), reserve: int64(reserve)}
}

// Acquire counts one more connection. ok is false when it is beyond the
// cap and the reserve (it is then not counted); overflow says it is in
// the reserve.
func (c *Counter) Acquire() (overflow, ok bool) {
	n := c.active.Add(1)
	if c.max <= 0 {
		return false, true
	}
	if n > c.max+c.reserve {
		c.active.Add(-1)
		return false, false
	}
	return n > c.max, true
}

// Release uncounts a closed connection.
func (c *Counter) Release() { c.active.Add(-1) }

// Active is the number of connections counted.
func (c *Counter) Active() int64 { return c.active.Load() }

// Refuse writes Refusal to a connection Acquire refused, best effort (a
// client that already sent its request may see the connection reset
// instead), and closes it.
func Refuse(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(Refusal)
	_ = c.Close()
}

// Listener applies a Counter to the connections its Accept returns: each
// is a *Conn, counted until closed.
type Listener struct {
	net.Listener
	*Counter
	// CloseOnly closes the connections beyond the cap without writing the
	// cleartext Refusal: for a listener whose connections speak TLS,
	// where those bytes would only be a handshake error.
	CloseOnly bool
}

// Accept returns the next connection within the cap and the reserve,
// refusing those beyond.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		overflow, ok := l.Acquire()
		if ok {
			return &Conn{Conn: c, Overflow: overflow, release: l.Release}, nil
		}
		if l.CloseOnly {
			_ = c.Close()
			continue
		}
		Refuse(c)
	}
}

// Conn is a counted connection. Overflow says it is in the reserve: the
// server should serve it only what the reserve is for.
type Conn struct {
	net.Conn
	Overflow bool
	release  func()
	once     sync.Once
}

// Counted returns c counted by release until closed (release is called
// once, on the first Close).
func Counted(c net.Conn, release func()) *Conn { return &Conn{Conn: c, release: release} }

// Close closes the connection and uncounts it.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes a TCP connection: net/http uses it for a
// lingering close after an answer to a request whose body it did not
// read.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
