//go:build linux

package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/connlimit"
	"github.com/fencegate/fencegate/internal/evloop"
)

// TLS on the event loops. The loops speak plaintext through their own
// system calls, and there is no kernel TLS here, so a TLS listener's
// connections reach them through a relay: acceptTLS accepts in Go, a
// goroutine per connection runs the handshake (crypto/tls, the server's
// *tls.Config: certificates re-read on reload, mutual TLS as configured,
// bounded by the header timeout), and then
//
//   - a connection whose ALPN is h2 goes to the general engine as a
//     *tls.Conn, exactly as without the loops;
//   - any other (http/1.1, or no ALPN) gets an AF_UNIX socket pair: one
//     end is registered with a loop as an accepted connection that knows
//     the client's address and TLS (X-Forwarded-Proto https, the client's
//     IP in X-Forwarded-For and the logs, the same on a hand-off to the
//     general engine); the other end and the client's TCP socket go to
//     the same loop as a tlsPump, which moves bytes between them on the
//     loop's thread: ciphertext read from the client is decrypted by the
//     connection's *tls.Conn, fed from memory (tlsConnIO), and written to
//     the pair; what the loop writes to the pair is encrypted and written
//     to the client. No goroutine runs for the connection once its
//     handshake is done.
//
// The pump holds the connection's place under the connection cap until
// it closes. It closes, both sockets, when the loop closes its end (after
// the rest of the loop's bytes and a close_notify), when a write to the
// client fails or makes no progress for the idle timeout, or when the
// loop stops. When the client closes or resets its connection, the loop
// reads the end of its input, as from a client's TCP connection. Buffers
// are bounded: the pump reads the client only once what it decrypted is
// in the pair and while less than maxPendingToClient waits for the
// client's socket, and the pair only once what it encrypted is with the
// client's socket, so a client that stops reading fills the pair and the
// loop's own bounds for a slow reader apply.

// acceptTLS accepts the TLS listener's connections until it is closed
// (stopAccepting), and hands each to a handshake of its own.
func (e *loopEngine) acceptTLS() {
	var delay time.Duration
	for {
		raw, err := e.tlsLn.Accept()
		if err != nil {
			if e.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// As net/http's server: back off on a temporary error
			// (out of descriptors), up to a second.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			e.g.log.Warn("gate accept failed", "error", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-e.ctx.Done():
				return
			}
			continue
		}
		delay = 0
		if e.closing.Load() {
			_ = raw.Close()
			continue
		}
		client := connlimit.Client(raw.RemoteAddr())
		if _, ok := e.s.limit.Acquire(client); !ok {
			_ = raw.Close() // a cleartext refusal would only be a handshake error
			continue
		}
		counted := connlimit.Counted(raw, func() { e.s.limit.Release(client) })
		e.goTracked(workHandshake, func() { e.startTLS(counted) })
	}
}

// startTLS runs raw's handshake and gives the connection to the loops
// or, for HTTP/2, to the general engine.
func (e *loopEngine) startTLS(raw *connlimit.Conn) {
	cio := &tlsConnIO{raw: raw}
	tc := tls.Server(cio, e.s.tls)
	ctx, cancel := context.WithTimeout(e.ctx, e.s.headerTimeout) // a slow handshake is bounded
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil || e.closing.Load() {
		_ = raw.Close()
		return
	}
	st := tc.ConnectionState()
	if st.NegotiatedProtocol == "h2" {
		if !e.s.handoff.give(tc) {
			_ = raw.Close()
		}
		return
	}
	remote, _ := raw.RemoteAddr().(*net.TCPAddr)
	if remote == nil {
		remote = &net.TCPAddr{}
	}
	// The client's socket leaves Go's poller for the loop's: a duplicate,
	// non-blocking, and the original closed (not raw: its place under the
	// cap goes with the pump).
	tcpFD := -1
	if sc, ok := raw.Conn.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) { tcpFD, _ = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
		}
	}
	if tcpFD < 0 || unix.SetNonblock(tcpFD, true) != nil {
		if tcpFD >= 0 {
			unix.Close(tcpFD)
		}
		_ = raw.Close()
		return
	}
	_ = raw.Conn.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		e.g.log.Warn("gate: no socket pair for a TLS connection", "error", err)
		unix.Close(tcpFD)
		raw.Release()
		return
	}
	p := &tlsPump{e: e, slot: raw, tc: tc, idle: e.s.idleTimeout}
	p.tcp.FD, p.pair.FD = tcpFD, fds[1]
	cio.p = p
	to := e.loops[int(e.next.Add(1))%len(e.loops)]
	if !to.post(func() { to.addTLS(fds[0], remote, &st, p) }) {
		unix.Close(fds[0]) // that loop has stopped
		p.close()
	}
}

// addTLS starts serving a TLS connection: the loop's end of its socket
// pair as a client connection, and its pump.
func (l *eventLoop) addTLS(loopFD int, remote *net.TCPAddr, st *tls.ConnectionState, p *tlsPump) {
	if l.e.closing.Load() {
		unix.Close(loopFD)
		p.close()
		return
	}
	p.l = l
	l.fds.set(p.tcp.FD, pumpTCP{p})
	l.fds.set(p.pair.FD, pumpPair{p})
	p.tcp.Readable, p.tcp.Writable, p.pair.Writable = true, true, true
	if l.watch(p.tcp.FD, unix.EPOLL_CTL_ADD, false) != nil || l.watch(p.pair.FD, unix.EPOLL_CTL_ADD, false) != nil {
		unix.Close(loopFD)
		p.close()
		return
	}
	// The pump holds the connection's place under the cap, not the loop's
	// end of the pair.
	l.add(loopFD, remote, netip.Addr{}, st)
	p.run() // the client may have sent its request with its handshake
}

// maxPendingToClient bounds the ciphertext a pump holds for a client that
// does not read, beyond which it stops reading that client. What the loop
// writes is read from the pair only once the last of it is with the
// client's socket, so the pump never holds more than one read of it
// (loopReadBuffer, encrypted); the rest is what decrypting writes by
// itself: the answer to a client's TLS 1.3 KeyUpdate, one per record the
// client sends, which a client that never reads could otherwise pile up
// without end.
const maxPendingToClient = loopReadBuffer + 16<<10

// tlsPump moves a TLS connection's bytes, on its loop's thread, between
// the client's socket (ciphertext) and the pump's end of the socket pair
// whose other end the loop serves (plaintext).
type tlsPump struct {
	e    *loopEngine
	l    *eventLoop      // nil until the loop takes it
	slot *connlimit.Conn // the client's Go connection, closed: its place under the cap
	tc   *tls.Conn
	tcp  evloop.Sock // the client's socket; In: ciphertext tc has not read
	pair evloop.Sock // the pump's end of the pair; In: plaintext to encrypt
	// toLoop is plaintext decrypted and not yet written to the pair;
	// toClient ciphertext not yet written to the client.
	toLoop, toClient []byte
	inEnded          bool // the client's input ended (its close, a reset, an alert)
	shutIn           bool // the pair's end was told so
	closed           bool
	idle             time.Duration // a write to the client may make no progress this long
	stall            *time.Timer   // armed while a write to the client makes no progress
}

// The pump's two sockets, as the loop's fd owners.
type (
	pumpTCP  struct{ *tlsPump }
	pumpPair struct{ *tlsPump }
)

func (o pumpTCP) ready(ev uint32) {
	o.tcp.Note(o.l.p, ev)
	o.run()
}

func (o pumpPair) ready(ev uint32) {
	o.pair.Note(o.l.p, ev)
	o.run()
}

// run moves bytes both ways as far as the sockets allow.
func (p *tlsPump) run() {
	for !p.closed {
		if p.tcp.Err != nil || p.pair.Err != nil {
			p.close()
			return
		}
		moved := false
		// The client to the loop.
		if len(p.toLoop) > 0 {
			n, err := p.pair.Write(p.l.p, p.toLoop)
			if err != nil {
				p.close() // the loop closed its end
				return
			}
			p.toLoop = p.toLoop[:copy(p.toLoop, p.toLoop[n:])]
			if len(p.toLoop) == 0 && cap(p.toLoop) > evloop.KeepBuffer {
				p.toLoop = nil // nor one large request
			}
			moved = moved || n > 0
		}
		if len(p.toLoop) == 0 && !p.inEnded && len(p.toClient) <= maxPendingToClient {
			if p.tcp.Fill(p.l.buf) {
				moved = true
			}
			if !p.decrypt() {
				return
			}
			if len(p.toLoop) > 0 {
				continue
			}
		}
		if len(p.toLoop) == 0 && p.inEnded && !p.shutIn {
			p.shutIn = true
			_ = unix.Shutdown(p.pair.FD, unix.SHUT_WR) // the loop reads the end of its input
		}
		// The loop to the client.
		if len(p.toClient) > 0 && !p.flushClient() {
			return
		}
		if p.pair.Fill(p.l.buf) {
			if _, err := p.tc.Write(p.pair.In); err != nil { // into toClient
				p.close()
				return
			}
			p.pair.In = p.pair.In[:0]
			continue
		}
		if p.pair.EOF { // the loop closed its end, and its bytes are with the client's socket
			_ = p.tc.Close() // its close_notify, into toClient
			p.flushClient()
			p.close()
			return
		}
		if !moved {
			return
		}
	}
}

// decrypt reads what tc can make of the ciphertext in p.tcp.In into
// p.toLoop; false when p closed.
func (p *tlsPump) decrypt() bool {
	for {
		n, err := p.tc.Read(p.l.buf)
		p.toLoop = append(p.toLoop, p.l.buf[:n]...)
		if err == nil {
			continue
		}
		if !errors.Is(err, errTLSWouldBlock) {
			p.inEnded = true // its close_notify, the end of its socket, or a broken record
		}
		if len(p.toClient) > 0 && !p.flushClient() && p.closed { // an answer tc gave (a key update)
			return false
		}
		return true
	}
}

// flushClient writes p.toClient to the client's socket, as far as it
// takes; false when some is left or p closed. A write that makes no
// progress for the idle timeout closes p.
func (p *tlsPump) flushClient() bool {
	n, err := p.tcp.Write(p.l.p, p.toClient)
	if err != nil {
		p.close() // the client is gone
		return false
	}
	p.toClient = p.toClient[:copy(p.toClient, p.toClient[n:])]
	if len(p.toClient) == 0 {
		if cap(p.toClient) > evloop.KeepBuffer+1024 {
			p.toClient = nil // one large answer does not pin its buffer
		}
		if p.stall != nil {
			p.stall.Stop()
		}
		return true
	}
	switch {
	case p.stall == nil:
		l := p.l
		p.stall = time.AfterFunc(p.idle, func() { l.post(p.close) })
	case n > 0:
		p.stall.Reset(p.idle)
	}
	return false
}

// close closes both of p's sockets and gives back its place under the
// connection cap.
func (p *tlsPump) close() {
	if p.closed {
		return
	}
	p.closed = true
	if p.stall != nil {
		p.stall.Stop()
	}
	if p.l != nil {
		p.l.fds.del(p.tcp.FD)
		p.l.fds.del(p.pair.FD)
	}
	unix.Close(p.tcp.FD)
	unix.Close(p.pair.FD)
	p.slot.Release()
}

// shutPump closes p when its loop stops (closeAll).
func (p *tlsPump) shutPump() { p.close() }

// errTLSWouldBlock is tlsConnIO's answer to a read with no ciphertext
// left: a temporary net.Error, after which a *tls.Conn keeps its state
// (a partial record included) and reads again on the next call.
var errTLSWouldBlock = &tlsWouldBlock{}

type tlsWouldBlock struct{}

func (*tlsWouldBlock) Error() string   { return "tls pump: no input yet" }
func (*tlsWouldBlock) Timeout() bool   { return true }
func (*tlsWouldBlock) Temporary() bool { return true }

// tlsConnIO is the connection under a TLS connection's *tls.Conn: the
// client's Go connection during the handshake (and for HTTP/2, which
// net/http serves), then, once p is set, the pump's buffers: reads take
// the ciphertext the pump read, writes add to what it writes to the
// client.
type tlsConnIO struct {
	raw *connlimit.Conn
	p   *tlsPump
}

func (c *tlsConnIO) Read(b []byte) (int, error) {
	p := c.p
	if p == nil {
		return c.raw.Read(b)
	}
	if len(p.tcp.In) == 0 {
		if p.tcp.EOF {
			return 0, io.EOF
		}
		return 0, errTLSWouldBlock
	}
	n := copy(b, p.tcp.In)
	p.tcp.In = p.tcp.In[n:]
	return n, nil
}

func (c *tlsConnIO) Write(b []byte) (int, error) {
	if c.p == nil {
		return c.raw.Write(b)
	}
	c.p.toClient = append(c.p.toClient, b...)
	return len(b), nil
}

func (c *tlsConnIO) Close() error {
	if c.p == nil {
		return c.raw.Close()
	}
	return nil // the pump closes the socket
}

func (c *tlsConnIO) LocalAddr() net.Addr  { return c.raw.LocalAddr() }
func (c *tlsConnIO) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }

func (c *tlsConnIO) SetDeadline(t time.Time) error {
	if c.p == nil {
		return c.raw.SetDeadline(t)
	}
	return nil
}

func (c *tlsConnIO) SetReadDeadline(t time.Time) error {
	if c.p == nil {
		return c.raw.SetReadDeadline(t)
	}
	return nil
}

func (c *tlsConnIO) SetWriteDeadline(t time.Time) error {
	if c.p == nil {
		return c.raw.SetWriteDeadline(t)
	}
	return nil
}
