//go:build linux

package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/connlimit"
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
//     general engine); the relay copies plaintext between the *tls.Conn
//     and the other end, one goroutine per direction.
//
// The relay holds the connection's place under the connection cap until
// the client's connection is closed. It ends, both goroutines and every
// descriptor, when the loop closes its end (the loop's timeouts, a
// close after an answer, Shutdown's drain, Close), when the client
// closes or resets its connection, when a write to the client stalls
// for the idle timeout, or when the engine stops. Buffers are bounded:
// a client that stops reading blocks the relay's write, the socket
// pair's buffer fills, and the loop's own bounds for a slow reader
// apply.

// tlsRelayRead is what the client-to-loop direction reads from the TLS
// connection at once.
const tlsRelayRead = 8 << 10

// tlsRelayBuffers are the loop-to-client direction's buffers, taken only
// while there are bytes to move (one TLS record's worth).
var tlsRelayBuffers = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

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
		if _, ok := e.s.limit.Acquire(); !ok {
			_ = raw.Close() // a cleartext refusal would only be a handshake error
			continue
		}
		counted := connlimit.Counted(raw, e.s.limit.Release)
		e.goTracked(func() { e.startTLS(counted) })
	}
}

// startTLS runs raw's handshake and gives the connection to the loops
// or, for HTTP/2, to the general engine.
func (e *loopEngine) startTLS(raw *connlimit.Conn) {
	tc := tls.Server(raw, e.s.tls)
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
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		e.g.log.Warn("gate: no socket pair for a TLS connection", "error", err)
		_ = raw.Close()
		return
	}
	f := os.NewFile(uintptr(fds[1]), "gate-tls-relay")
	pc, err := net.FileConn(f) // a duplicate, in Go's poller
	f.Close()
	if err != nil {
		unix.Close(fds[0])
		_ = raw.Close()
		return
	}
	r := &tlsRelay{tc: tc, raw: raw, pc: pc.(*net.UnixConn), idle: e.s.idleTimeout}
	remote, _ := raw.RemoteAddr().(*net.TCPAddr)
	if remote == nil {
		remote = &net.TCPAddr{}
	}
	// The relay runs first: should the loop refuse the connection, its
	// end closes and the relay ends on its own.
	stop := context.AfterFunc(e.ctx, r.abort) // the engine stops: nothing may block stop
	var both sync.WaitGroup
	both.Go(r.toLoop)
	e.goTracked(func() {
		r.toClient()
		both.Wait()
		stop()
	})
	to := e.loops[int(e.next.Add(1))%len(e.loops)]
	if !to.post(func() {
		if e.closing.Load() {
			unix.Close(fds[0])
			return
		}
		to.add(fds[0], remote, &st)
	}) {
		unix.Close(fds[0]) // that loop has stopped
	}
}

// tlsRelay copies plaintext between a client's TLS connection and a
// loop's end of a socket pair.
type tlsRelay struct {
	tc   *tls.Conn
	raw  *connlimit.Conn // under tc: closing it gives back the cap's place
	pc   *net.UnixConn   // the relay's end of the socket pair
	idle time.Duration   // a write to the client may stall this long
	once sync.Once
}

// toLoop copies what the client sends to the loop. When the client
// stops sending (its close, a reset), the loop reads the end of its
// input, as from a client's TCP connection.
func (r *tlsRelay) toLoop() {
	buf := make([]byte, tlsRelayRead)
	for {
		n, err := r.tc.Read(buf)
		if n > 0 {
			if _, werr := r.pc.Write(buf[:n]); werr != nil {
				r.abort() // the loop closed its end
				return
			}
		}
		if err != nil {
			_ = r.pc.CloseWrite()
			return
		}
	}
}

// toClient copies what the loop writes to the client, until the loop
// closes its end (then the TLS connection is closed, with its
// close_notify) or a write to the client fails or stalls.
func (r *tlsRelay) toClient() {
	defer r.abort()
	rc, err := r.pc.SyscallConn()
	if err != nil {
		return
	}
	for {
		var b *[]byte
		var n int
		var rerr error
		// Wait for input without a buffer, so an idle connection holds
		// none.
		if err := rc.Read(func(fd uintptr) bool {
			b = tlsRelayBuffers.Get().(*[]byte)
			for {
				n, rerr = unix.Read(int(fd), *b)
				if rerr != unix.EINTR {
					break
				}
			}
			if rerr == unix.EAGAIN {
				tlsRelayBuffers.Put(b)
				b = nil
				return false
			}
			return true
		}); err != nil {
			if b != nil {
				tlsRelayBuffers.Put(b)
			}
			return
		}
		if rerr != nil || n <= 0 {
			tlsRelayBuffers.Put(b)
			if rerr == nil { // the loop closed its end: a clean close
				_ = r.tc.Close() // its close_notify has a deadline of its own
			}
			return
		}
		_ = r.tc.SetWriteDeadline(time.Now().Add(r.idle))
		_, werr := r.tc.Write((*b)[:n])
		tlsRelayBuffers.Put(b)
		if werr != nil {
			return
		}
	}
}

// abort closes both sides at once: the client's connection (under its
// TLS, so a write blocked in it returns), and the relay's end of the
// socket pair (the loop reads its end).
func (r *tlsRelay) abort() {
	r.once.Do(func() {
		_ = r.raw.Close()
		_ = r.pc.Close()
	})
}
