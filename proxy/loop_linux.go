//go:build linux

package proxy

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/connlimit"
	"github.com/fencegate/fencegate/internal/evloop"
	"github.com/fencegate/fencegate/internal/h1"
)

// One event loop: its pass over ready sockets and its inbox, accepting and
// adopting connections, its deadline sweep, and closing what it owns. The
// engine that starts and stops the loops is loopengine_linux.go; a
// connection's own states are loopconn_linux.go.

// eventLoop is one epoll loop and the connections it owns. Only its
// goroutine touches them; other goroutines hand it work with post.
type eventLoop struct {
	e       *loopEngine
	p       *evloop.Poller // its epoll instance and inbox
	fds     fdTable
	clients map[*loopConn]struct{}
	pool    upstreamPool // its upstream connections (looppool_linux.go)
	stopped bool
	exited  chan struct{} // closed when run returns

	admission loopAdmission   // writes on their way to a batched admission (loopadmit_linux.go)
	marks     loopMarks       // the store's mark reader (loopmarks_linux.go)
	passed    []passedRequest // to forward at the end of the pass (see forwardLater)
	forwarded []passedRequest // passed's other array, reused
	now       time.Time

	batchIO loopBatchIO // the pass's reads and writes batched through io_uring (loopring_linux.go)

	buf       []byte      // one read
	hdr       http.Header // the headers decide reads, reused (see decisionHeader)
	lastSweep time.Time
	lastYield time.Time   // when the loop last went through the Go scheduler (see loopYield)
	passes    uint64      // passes run, a count for tests
	cur       *loopConn   // the connection the current step serves (loopguard_linux.go)
	touched   []*loopConn // the connections the current pass touched
	resp      h1.Response // the response head parsed last (readResponse), reused
}

// fdOwner is a socket of a loop: a client or an upstream connection.
type fdOwner interface{ ready(events uint32) }

// fdTable maps a loop's descriptors to their owners, nil for none: a
// slice indexed by descriptor (small integers, reused after a close),
// which a pass looks up several times a request.
type fdTable []fdOwner

func (t fdTable) get(fd int) fdOwner {
	if fd >= 0 && fd < len(t) {
		return t[fd]
	}
	return nil
}

func (t *fdTable) set(fd int, o fdOwner) {
	if fd >= len(*t) {
		*t = append(*t, make(fdTable, max(fd+1, 2*len(*t), 64)-len(*t))...)
	}
	(*t)[fd] = o
}

func (t fdTable) del(fd int) {
	if fd >= 0 && fd < len(t) {
		t[fd] = nil
	}
}

func newEventLoop(e *loopEngine) (*eventLoop, error) {
	p, err := evloop.New()
	if err != nil {
		return nil, err
	}
	l := &eventLoop{e: e, p: p, clients: make(map[*loopConn]struct{}),
		buf: make([]byte, loopReadBuffer), exited: make(chan struct{})}
	l.pool.l = l
	l.hdr = make(http.Header, 2)
	if e.lnFD < 0 {
		return l, nil // a TLS listener: acceptTLS adds the connections
	}
	if err := p.Add(e.lnFD, unix.EPOLLIN|unix.EPOLLEXCLUSIVE); err != nil {
		p.Close()
		return nil, err
	}
	return l, nil
}

// post runs f on l's goroutine (see evloop.Poller.Post): false once the
// loop has stopped and closeAll has run, when its caller cleans up what f
// would have (a dialed descriptor, a barrier place). Until then, f runs on
// the loop or, if the loop stopped meanwhile, in closeAll.
func (l *eventLoop) post(f func()) bool { return l.p.Post(f) }

// call runs f on l's goroutine and waits for it; it does not run f once
// the loop has stopped.
func (l *eventLoop) call(f func()) {
	done := make(chan struct{})
	l.post(func() { f(); close(done) })
	select {
	case <-done:
	case <-l.exited:
	}
}

func (l *eventLoop) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(l.exited)
	defer func() {
		if l.admission.admitCh != nil {
			close(l.admission.admitCh)
		}
	}()
	if !l.e.s.noRing {
		l.openRing()
		defer func() {
			if l.batchIO.ring != nil {
				_ = l.batchIO.ring.Close()
			}
		}()
	}
	events := make([]unix.EpollEvent, loopEvents)
	l.now = time.Now()
	l.lastSweep = l.now
	l.lastYield = l.now
	wait := loopTick
	for !l.stopped {
		n, err := l.p.Wait(events, wait)
		if err != nil {
			l.e.g.log.Error("gate event loop failed", "error", err)
			return
		}
		wait = loopTick
		if !l.pass(events[:n]) {
			wait = l.idleWait()
		}
		if l.now.Sub(l.lastYield) >= loopYield { // after the pass's writes went out
			l.lastYield = l.now
			runtime.Gosched()
		}
	}
}

// pass moves on what the events and the inbox make ready, each socket's
// event, posted function, deadline and queued write a step of its own
// (see loopguard_linux.go: a panic in one closes the connections it
// touched, and the pass goes on). It reports whether it had an event or a
// posted function to run: a pass without either was woken by its timeout.
func (l *eventLoop) pass(events []unix.EpollEvent) (woken bool) {
	l.now = time.Now()
	l.passes++
	if lb := l.e.g.logBatch; lb != nil {
		lb.Hold()
		defer lb.Release() // the pass's log lines, in one write
	}
	defer l.endPass()
	defer l.containPass()
	l.readAhead(events)
	for i := range events {
		fd := int(events[i].Fd)
		switch {
		case fd == l.e.lnFD:
			l.accept()
		default:
			if o := l.fds.get(fd); o != nil {
				l.step(func() { o.ready(events[i].Events) })
			}
		}
	}
	woken = l.runInbox() || len(events) > 0
	l.forwardPassed()
	l.sendAdmits()
	if l.now.Sub(l.lastSweep) >= loopTick {
		l.lastSweep = l.now
		l.sweep()
	}
	for len(l.batchIO.writes) > 0 {
		l.writeQueued()
		l.forwardPassed()
		l.sendAdmits()
	}
	return woken
}

// forwardPassed forwards the requests the pass admitted (see
// forwardLater), and those that forwarding them admits in turn (a
// pipelined request behind one answered at once).
func (l *eventLoop) forwardPassed() {
	for len(l.passed) > 0 {
		batch := l.passed
		l.passed = l.forwarded[:0]
		for i, p := range batch {
			l.step(func() { p.c.admitted(p.t, true) })
			batch[i] = passedRequest{}
		}
		l.forwarded = batch[:0]
	}
}

// runInbox runs what was posted, and reports whether there was any.
func (l *eventLoop) runInbox() bool {
	work := l.p.Take()
	for _, f := range work {
		l.step(f)
	}
	return len(work) > 0
}

// accept takes the listener's pending connections and deals them out to
// the loops in turn.
func (l *eventLoop) accept() {
	e := l.e
	for range 64 {
		fd, sa, err := unix.Accept4(e.lnFD, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			if err != unix.EAGAIN && err != unix.EINTR && err != unix.ECONNABORTED {
				e.g.log.Warn("gate accept failed", "error", err)
			}
			return
		}
		if e.closing.Load() {
			unix.Close(fd)
			continue
		}
		remote := tcpAddr(sa)
		client := sockaddrClient(sa)
		if _, ok := e.s.limit.Acquire(client); !ok {
			_, _ = unix.Write(fd, connlimit.Refusal) // best effort: the connection is closed either way
			unix.Close(fd)
			continue
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			e.g.log.Debug("gate: TCP_NODELAY refused on a client connection", "error", err) // served all the same, a little later
		}
		to := e.loops[int(e.next.Add(1))%len(e.loops)]
		if to == l {
			l.add(fd, remote, client, nil)
		} else if !to.post(func() { to.add(fd, remote, client, nil) }) {
			unix.Close(fd) // that loop has stopped
			e.s.limit.Release(client)
		}
	}
}

// add starts serving client connection fd, from remote, counted under
// the connection cap as client (connlimit.Client). tlsState is the
// connection's TLS, for one whose TLS a relay terminates (fd is then the
// loop's end of the relay's socket pair, see looptls_linux.go; its relay
// holds its place under the cap), or nil.
func (l *eventLoop) add(fd int, remote *net.TCPAddr, client netip.Addr, tlsState *tls.ConnectionState) {
	c := &loopConn{Sock: evloop.Sock{FD: fd}, l: l, remote: remote, client: client, tls: tlsState}
	c.request.remote, c.request.tls = remote, tlsState != nil // TLS: X-Forwarded-Proto https
	c.enter(stHead)
	l.clients[c] = struct{}{}
	l.fds.set(fd, c)
	c.Writable = true
	if err := l.watch(fd, unix.EPOLL_CTL_ADD, false); err != nil {
		c.close()
	}
}

// sockaddrClient is the connlimit.Client key of a peer's address.
func sockaddrClient(sa unix.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return connlimit.ClientIP(netip.AddrFrom4(a.Addr))
	case *unix.SockaddrInet6:
		return connlimit.ClientIP(netip.AddrFrom16(a.Addr))
	}
	return netip.Addr{}
}

func tcpAddr(sa unix.Sockaddr) *net.TCPAddr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	return &net.TCPAddr{}
}

// watch registers socket fd with the loop, or changes its registration
// (see evloop.Poller.Watch).
func (l *eventLoop) watch(fd, op int, out bool) error { return l.p.Watch(fd, op, out) }

// sweep fires the deadlines that passed, and drops upstream connections
// idle too long.
func (l *eventLoop) sweep() {
	for c := range l.clients {
		if !c.deadline.IsZero() && l.now.After(c.deadline) {
			l.step(c.expire)
		}
	}
	l.pool.sweep(l.now)
	l.marks.checkOverdue(l)
}

// idleWait is how long the loop may sleep after a pass that its timeout
// woke (no socket ready, nothing posted): until the earliest deadline of
// its connections and its idle upstream connections, at least loopTick
// and at most loopIdleMax. Everything else that can move a loop on reaches
// it as an event (its sockets, its inbox's eventfd), but for two things
// its sweep polls: a mark batch overdue, and an upstream connection
// another loop freed for a request waiting here; while either is pending
// it sleeps loopTick. Called at the end of a pass, when the pass's
// deadlines are set; a deadline is only ever set by a pass (enter).
func (l *eventLoop) idleWait() time.Duration {
	if m := l.marks.conn; m != nil && len(m.batch) > 0 || len(l.pool.waiting) > 0 {
		return loopTick
	}
	next := l.now.Add(loopIdleMax)
	for c := range l.clients {
		if !c.deadline.IsZero() && c.deadline.Before(next) {
			next = c.deadline
		}
	}
	if len(l.pool.idle) > 0 { // the oldest first
		if t := l.pool.idle[0].idleSince.Add(upstreamIdle); t.Before(next) {
			next = t
		}
	}
	// A millisecond more: the sweep fires a deadline once it has passed,
	// and epoll counts whole milliseconds.
	return min(max(time.Until(next)+time.Millisecond, loopTick), loopIdleMax)
}

// endIdle closes the client connections between requests (Shutdown).
func (l *eventLoop) endIdle() {
	for c := range l.clients {
		if c.state == stHead && len(c.In) == 0 {
			c.close()
		}
	}
}

// closeAll closes what the loop still holds, once it has stopped. What
// was posted and not run yet runs now, on closed connections (a write's
// barrier place is left, a dialed connection closed); what is posted from
// now on is refused, and its poster cleans up.
func (l *eventLoop) closeAll() {
	work := l.p.Shut()
	for c := range l.clients {
		c.close()
	}
	for _, o := range l.fds {
		if p, ok := o.(interface{ shutPump() }); ok {
			p.shutPump() // a TLS connection's pump (looptls_linux.go)
		}
	}
	for _, f := range work {
		l.step(f)
	}
	l.endPass()
	l.pool.closeIdle()
	l.marks.close()
	l.p.Close()
}

// forget drops c from the loop's tables.
func (l *eventLoop) forget(c *loopConn) {
	delete(l.clients, c)
	l.fds.del(c.FD)
	l.pool.unqueue(c)
}

var (
	errUpstreamClosed = errors.New("the upstream closed the connection before answering")
	errUpstreamHead   = errors.New("the upstream's response head is malformed or too large")
	errUpstreamBody   = errors.New("the upstream's response body is malformed")
)
