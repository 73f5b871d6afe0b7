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
// requests waiting for one while UpstreamConns are all in use, and the
// dials (on goroutines the engine waits for on stop). It runs on its
// loop's goroutine only. The places under UpstreamConns are the engine's
// (upConns), shared by every loop, while each loop keeps its own idle
// connections: a loop whose requests wait at the cap asks the others to
// close idle ones (reclaim), so that a place kept idle on one loop never
// makes a request on another wait. A connection's exchange is
// loopupstream_linux.go's.
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
	p.dialWaiting()
	if len(p.waiting) > 0 {
		p.reclaim(len(p.waiting))
	}
}

// dialWaiting dials for the waiting requests, as many as there are
// places free.
func (p *upstreamPool) dialWaiting() {
	for len(p.waiting) > 0 && p.reserve() {
		p.dial(popFront(&p.waiting))
	}
}

// reserve takes a place under UpstreamConns for a new connection, if one
// is free.
func (p *upstreamPool) reserve() bool {
	e := p.l.e
	for {
		n := e.upConns.Load()
		if n >= e.maxUp {
			return false
		}
		if e.upConns.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// reclaim asks the other loops, one after another in the engine's order,
// to close n of their idle upstream connections in all, the longest idle
// first; each loop that closed any wakes this one, whose waiting requests
// then dial in the places freed. Asking in turn closes no more than the n
// places needed, however many loops there are (asking every loop at once
// could close n on each). A loop with requests of its own waiting has no
// idle connection (put gives them to its requests), so only places nobody
// uses are taken. Called when a request starts waiting, and from sweep
// while requests wait (every loopTick).
func (p *upstreamPool) reclaim(n int) {
	p.reclaimFrom(1, n)
}

// reclaimFrom asks the loop step places after p's to close up to n idle
// connections, and passes what it could not close on to the next loop,
// until every other loop was asked. The loop asked runs the rest of the
// chain: it reads only what never changes after the loops start (p.l and
// the engine's loops) and posts to p's loop what touches p.
func (p *upstreamPool) reclaimFrom(step, n int) {
	l := p.l
	loops := l.e.loops
	if n <= 0 || step >= len(loops) {
		return
	}
	o := loops[(slices.Index(loops, l)+step)%len(loops)]
	o.post(func() { // refused once o has stopped: its connections are closed anyway
		closed := o.pool.closeOldest(n)
		if closed > 0 {
			l.post(p.dialWaiting)
		}
		p.reclaimFrom(step+1, n-closed)
	})
}

// closeIdle closes every idle connection (the loop has stopped).
func (p *upstreamPool) closeIdle() { p.closeOldest(len(p.idle)) }

// closeOldest closes up to n idle connections, the longest idle first,
// and returns how many it closed.
func (p *upstreamPool) closeOldest(n int) int {
	closed := 0
	for closed < n && len(p.idle) > 0 {
		p.idle[0].close() // drops it from p.idle
		closed++
	}
	return closed
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

// get gives c an upstream connection: an idle one the upstream has not
// closed (see upConn.closedByPeer), a new one, or a place in the queue
// when UpstreamConns are all in use.
func (p *upstreamPool) get(c *loopConn) {
	for n := len(p.idle); n > 0; n = len(p.idle) {
		// The one used last, as nginx's upstream keepalive and net/http
		// take theirs: at low load the same few connections (warm in the
		// kernel, at a worker of the upstream that is awake) carry the
		// requests, and the surplus left by a burst goes idle and is
		// closed after upstreamIdle by sweep, which closes the longest
		// idle first.
		u := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		if u.closedByPeer(p.l.now) {
			u.close()
			continue
		}
		u.attach(c)
		return
	}
	p.dialNew(c)
}

// dialNew gives c a new connection, or a place in the queue when
// UpstreamConns are all in use. A read sent again after its pooled
// connection broke takes this way, not another idle connection, which may
// be as stale.
func (p *upstreamPool) dialNew(c *loopConn) {
	if p.reserve() {
		p.dial(c)
		return
	}
	p.waiting = append(p.waiting, c)
	if len(p.waiting) == 1 { // later ones: sweep asks again
		p.reclaim(1)
	}
}

// popFront removes the first element of *s and returns it. The rest moves
// down, so the array is reused by later appends (slicing the first off
// would make them reallocate it, about once per request).
func popFront[T any](s *[]T) T {
	v := (*s)[0]
	*s = slices.Delete(*s, 0, 1)
	return v
}

// dial opens a new upstream connection for c, in a place reserve took,
// on a goroutine (name resolution and connecting may block), then hands
// it to the loop.
func (p *upstreamPool) dial(c *loopConn) {
	l := p.l
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
			l.fds.set(fd, u)
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
