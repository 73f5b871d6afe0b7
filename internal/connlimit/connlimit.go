// Package connlimit caps a server's concurrent client connections without
// blocking its accept loop: a connection beyond the cap and a reserve is
// answered 503 too-many-connections (a problem+json body, before any
// request is read) and closed at once, so the process never holds more
// connections than it allows and cannot run out of file descriptors.
// (Blocking accept, as netutil.LimitListener does, would leave clients
// waiting in the kernel's backlog with no answer.)
//
// A Counter may also cap the connections of each client (see Client), so
// that one address cannot take every place under the cap: a connection
// beyond its client's share gets the same refusal, and counts against
// nothing.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/fencing/problem"
)

// Refusal is the answer written to a connection beyond the cap and the
// reserve.
var Refusal = problem.TooManyConnections().Response()

// Counter counts open connections against a cap, with a reserve beyond
// it, and each client's against a per-client cap. Safe for concurrent
// use.
type Counter struct {
	max, reserve int64
	perClient    int
	active       atomic.Int64
	// Refusals, by reason.
	refusedTotal, refusedPerClient atomic.Int64

	mu      sync.Mutex
	clients map[netip.Addr]int // open connections by client; no entry at zero
}

// NewCounter returns a counter for max connections (zero or less: no cap)
// plus reserve ones marked overflow, of which one client may hold at most
// perClient (zero or less: no per-client cap). The per-client cap counts
// the reserve too.
func NewCounter(max, reserve, perClient int) *Counter {
	c := &Counter{max: int64(max), reserve: int64(reserve), perClient: perClient}
	if perClient > 0 {
		c.clients = make(map[netip.Addr]int)
	}
	return c
}

// Client is the key a connection from remote counts under in the
// per-client cap: the IP address of a TCP peer, IPv4 (an IPv4-mapped IPv6
// address included) as it is, IPv6 reduced to its /64 prefix (what one
// host or one customer usually holds, as it can pick any address in it).
// Any other address (a Unix socket's) gives the zero Addr: such a
// connection is not capped per client.
func Client(remote net.Addr) netip.Addr {
	a, ok := remote.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return netip.Addr{}
	}
	return ClientIP(ip)
}

// ClientIP is Client for a peer's IP address.
func ClientIP(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.WithZone("").Prefix(64)
		return p.Addr()
	}
	return ip
}

// Acquire counts one more connection, from client (a Client key; the zero
// Addr is not capped per client). ok is false when it is beyond the cap
// and the reserve, or beyond client's share (it is then not counted);
// overflow says it is in the reserve.
func (c *Counter) Acquire(client netip.Addr) (overflow, ok bool) {
	n := c.active.Add(1)
	if c.max > 0 && n > c.max+c.reserve {
		c.active.Add(-1)
		c.refusedTotal.Add(1)
		return false, false
	}
	if !c.take(client) {
		c.active.Add(-1)
		c.refusedPerClient.Add(1)
		return false, false
	}
	return c.max > 0 && n > c.max, true
}

// take counts a connection of client against its share, if it has room.
func (c *Counter) take(client netip.Addr) bool {
	if c.perClient <= 0 || !client.IsValid() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.clients[client]
	if n >= c.perClient {
		return false
	}
	c.clients[client] = n + 1
	return true
}

// Release uncounts a closed connection that Acquire counted, from the
// same client.
func (c *Counter) Release(client netip.Addr) {
	c.active.Add(-1)
	if c.perClient <= 0 || !client.IsValid() {
		return
	}
	c.mu.Lock()
	if n := c.clients[client] - 1; n > 0 {
		c.clients[client] = n
	} else {
		delete(c.clients, client)
	}
	c.mu.Unlock()
}

// Active is the number of connections counted.
func (c *Counter) Active() int64 { return c.active.Load() }

// Clients is the number of clients with a connection counted against the
// per-client cap (zero without one).
func (c *Counter) Clients() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.clients)
}

// RefusedInReserve counts a connection of the reserve that was refused all
// the same (its request was not a health check): beyond the cap, as one
// Acquire refused.
func (c *Counter) RefusedInReserve() { c.refusedTotal.Add(1) }

// Refused is the number of connections refused since the counter was
// made: beyond the cap (by Acquire, beyond the reserve, or in the reserve:
// RefusedInReserve) (total), and beyond a client's share (perClient).
func (c *Counter) Refused() (total, perClient int64) {
	return c.refusedTotal.Load(), c.refusedPerClient.Load()
}

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
		client := Client(c.RemoteAddr())
		overflow, ok := l.Acquire(client)
		if ok {
			return &Conn{Conn: c, Overflow: overflow, release: func() { l.Release(client) }}, nil
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
	c.Release()
	return err
}

// Release uncounts the connection without closing it, for a server that
// has taken its socket elsewhere and counts it there until it closes.
// Only the first of Release and Close uncounts.
func (c *Conn) Release() { c.once.Do(c.release) }

// CloseWrite half-closes a TCP connection: net/http uses it for a
// lingering close after an answer to a request whose body it did not
// read.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
