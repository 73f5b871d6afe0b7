//go:build linux

package proxy

import (
	"context"
	"net"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/evloop"
)

// upstreamPool is one loop's upstream connections: those idle, the
// requests waiting for one while UpstreamConns are all busy, and the dials
// (on goroutines the engine waits for on stop). It runs on its loop's
// goroutine only; the count of connections is the engine's (upConns),
// shared by every loop. A connection's exchange is loopupstream_linux.go's.
type upstreamPool struct {
	l       *eventLoop
	idle    []*upConn   // idle connections, most recent last
	waiting []*loopConn // requests waiting for a connection
}

// sweep drops the connections idle longer than upstreamIdle at now, and
// dials for a waiting request when a connection has become free.
func (p *upstreamPool) sweep(now time.Time) {
	for len(p.idle) > 0 && now.Sub(p.idle[0].idleSince) > upstreamIdle {
		p.idle[0].close()
	}
	if len(p.waiting) > 0 && p.l.e.upConns.Load() < p.l.e.maxUp {
		p.dial(popFront(&p.waiting))
	}
}

// closeIdle closes every idle connection (the loop has stopped).
func (p *upstreamPool) closeIdle() {
	for len(p.idle) > 0 {
		p.idle[0].close()
	}
}

// put returns u to the pool, or gives it to a request waiting for one.
func (p *upstreamPool) put(u *upConn) {
	if len(p.waiting) > 0 {
		c := popFront(&p.waiting)
		u.attach(c)
		c.run()
		return
	}
	u.idleSince = p.l.now
	p.idle = append(p.idle, u)
}

// drop takes u out of the idle connections, if it is there.
func (p *upstreamPool) drop(u *upConn) {
	if i := slices.Index(p.idle, u); i >= 0 {
		p.idle = slices.Delete(p.idle, i, i+1)
	}
}

// get gives c an upstream connection: an idle one, a new one, or a
// place in the queue when UpstreamConns are all busy.
func (p *upstreamPool) get(c *loopConn) {
	l := p.l
	if n := len(p.idle); n > 0 {
		// The one used last, as nginx's upstream keepalive and net/http
		// take theirs: at low load the same few connections (warm in the
		// kernel, at a worker of the upstream that is awake) carry the
		// requests, and the surplus left by a burst goes idle and is
		// closed after upstreamIdle by sweep, which closes the longest
		// idle first.
		u := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		u.attach(c)
		return
	}
	if l.e.upConns.Load() >= l.e.maxUp {
		p.waiting = append(p.waiting, c)
		return
	}
	p.dial(c)
}

// popFront removes the first element of *s and returns it. The rest moves
// down, so the array is reused by later appends (slicing the first off
// would make them reallocate it, about once per request).
func popFront[T any](s *[]T) T {
	v := (*s)[0]
	*s = slices.Delete(*s, 0, 1)
	return v
}

// dial opens a new upstream connection for c on a goroutine (name
// resolution and connecting may block), then hands it to the loop.
func (p *upstreamPool) dial(c *loopConn) {
	l := p.l
	l.e.upConns.Add(1)
	c.dialing = true
	g := l.e.g
	l.e.goTracked(workDial, func() {
		fd, err := dialFD(l.e.ctx, g.dialer.addr)
		posted := l.post(func() {
			fail := func(err error) {
				if c.dialing {
					c.dialing = false
					c.upstreamFailed(err)
					c.run()
				}
			}
			if err != nil {
				l.e.upConns.Add(-1)
				fail(err)
				return
			}
			u := &upConn{Sock: evloop.Sock{FD: fd}, l: l}
			l.fds[fd] = u
			if err := l.watch(fd, unix.EPOLL_CTL_ADD, false); err != nil {
				u.close()
				fail(&net.OpError{Op: "dial", Net: "tcp", Err: err})
				return
			}
			u.Writable = true
			if !c.dialing { // c went away meanwhile
				u.release()
				return
			}
			c.dialing = false
			u.attach(c)
			c.run()
		})
		if !posted { // the loop has stopped: the connection is not wanted
			if err == nil {
				unix.Close(fd)
			}
			l.e.upConns.Add(-1)
		}
	})
}

// dialFD connects to addr and returns the connection's descriptor, in
// non-blocking mode, owned by the caller.
func dialFD(ctx context.Context, addr string) (int, error) {
	nc, err := (&net.Dialer{Timeout: upstreamDialTimeout}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return -1, err
	}
	defer nc.Close()
	raw, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var dupErr error
	if err := raw.Control(func(s uintptr) { fd, dupErr = unix.Dup(int(s)) }); err != nil {
		return -1, err
	}
	if dupErr != nil {
		return -1, &net.OpError{Op: "dial", Net: "tcp", Err: dupErr}
	}
	unix.CloseOnExec(fd) // dup(2) does not carry close-on-exec over; fcntl cannot fail on a descriptor just made
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	return fd, nil
}

// unqueue takes c out of the queue for an upstream connection.
func (p *upstreamPool) unqueue(c *loopConn) {
	for i, w := range p.waiting {
		if w == c {
			p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
			break
		}
	}
}
