//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/connlimit"
	"github.com/fencegate/fencegate/internal/evloop"
	"github.com/fencegate/fencegate/internal/h1"
)

// The event-loop engine serves a gate's TCP listener on Linux without a
// goroutine per connection or per request: one epoll loop per two CPUs owns its
// client connections and the upstream connections they use, and moves each
// request through its steps (head, body, decision, admission, sending,
// response, relay) as its sockets become ready. A store that answers at
// once (fencing.QuickAdmitter) admits inside the loop; a store that admits
// in batches (fencing.BatchAdmitter) gets the loop's writes together, from
// one worker goroutine per loop (loopadmit_linux.go); otherwise admission
// runs on a goroutine of its own. A write that must wait its turn at the
// barrier waits on a goroutine too; the loop goes on with the request when
// it is done.
//
// The loops forward only the plainest requests, and only after fasthttp's
// own parser (the one the general path uses) has read their head: HTTP/1.1,
// strict CRLF line ends, no Transfer-Encoding, no Upgrade or Expect, a
// Content-Length body of at most Options.BodyBuffer bytes, an http
// upstream. Anything else (a malformed head, a large or chunked body, an
// upgrade) hands the connection, with the bytes it sent so far, to the
// fasthttp server of the general path, which serves it from then on: the
// edge rules and answers are those of one parser and one set of handlers.
// The request sent upstream is serialized by fasthttp from the same
// request object as on the general path.

// loopReadBuffer is what one read from a socket takes at most.
const loopReadBuffer = 64 << 10

// loopEvents is how many ready sockets one epoll_wait reports at most.
const loopEvents = 256

// loopRingEntries is how many reads and writes a loop's io_uring takes in
// one system call (writes beyond it take another).
const loopRingEntries = 512

// loopAheadRead is what a read made ahead of the state machine (see
// readAhead) takes from one socket at most.
const loopAheadRead = 8 << 10

// loopTick is how often a loop checks its deadlines: a timeout fires up to
// this late.
const loopTick = 20 * time.Millisecond

// loopYield is how often a loop goes through the Go scheduler
// (runtime.Gosched). A loop's goroutine otherwise never does: it only
// blocks in system calls, so its processor's scheduling count never moves,
// and the runtime's monitor (sysmon), which takes a processor whose
// goroutine has not been rescheduled for 10 ms to be running too long,
// then retakes it from every epoll wait and signals the thread, and keeps
// polling every 20 µs instead of backing off to 10 ms. Measured at one
// connection over 3 s: 0.34 monitor wake-ups per forwarded write before,
// under 0.01 after, thread signals from 111 to 13, and more writes per
// second at 50 connections (docs/performance.md). A yield costs a
// hand-off of the locked thread, a few microseconds, at most 200 times a
// second.
const loopYield = 5 * time.Millisecond

// loopEngine is the event loops of one Server.
type loopEngine struct {
	s        *Server
	g        *Gate
	lnFD     int          // the listener the loops accept from; -1 for a TLS listener
	tlsLn    net.Listener // a TLS listener: accepted by a goroutine, handshakes in Go (looptls_linux.go)
	loops    []*eventLoop
	next     atomic.Uint32
	upConns  atomic.Int64 // upstream connections open or being dialed
	maxUp    int64
	closing  atomic.Bool // Shutdown or Close: accept nothing, end idle connections
	done     chan struct{}
	doneOnce sync.Once
	wg       sync.WaitGroup // the loops
	// work is the engine's other goroutines (dials, admissions, waits
	// for a turn, the fallback's connections, mark readers opening,
	// handshakes): stop waits for them, after cancelling ctx, which
	// ends those that honour it, until its own context ends. running
	// counts them by kind, for stop's report of what it left.
	work    sync.WaitGroup
	running [workKinds]atomic.Int64
	ctx     context.Context
	cancel  context.CancelFunc

	mu     sync.Mutex
	handed map[*handedConn]bool // connections served by the fallback; true while idle
}

// newLoopEngine returns the event loops for ln, or nil when ln cannot be
// served by them (not a TCP listener, or an upstream spoken to over TLS or
// HTTP/2: the loops speak HTTP/1.1 over plain TCP only).
func newLoopEngine(s *Server, ln net.Listener) (*loopEngine, error) {
	tl, ok := ln.(*net.TCPListener)
	if !ok || s.g.upstream.Scheme != "http" || s.g.upstreamHTTP2 || s.g.noWriteReuse || s.noLoops {
		return nil, nil
	}
	lnFD := -1
	if s.tls == nil {
		raw, err := tl.SyscallConn()
		if err != nil {
			return nil, nil
		}
		var dupErr error
		if err := raw.Control(func(fd uintptr) { lnFD, dupErr = unix.Dup(int(fd)) }); err != nil {
			return nil, err
		}
		if dupErr != nil {
			return nil, dupErr
		}
		if err := unix.SetNonblock(lnFD, true); err != nil {
			unix.Close(lnFD)
			return nil, err
		}
	}
	e := &loopEngine{s: s, g: s.g, lnFD: lnFD, maxUp: int64(s.g.upstreamConns), done: make(chan struct{}),
		handed: make(map[*handedConn]bool)}
	if s.tls != nil {
		e.tlsLn = ln
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	for range loopCount(runtime.GOMAXPROCS(0)) {
		l, err := newEventLoop(e)
		if err != nil {
			e.cancel()
			e.closeLoops()
			if lnFD >= 0 {
				unix.Close(lnFD)
			}
			return nil, err
		}
		e.loops = append(e.loops, l)
	}
	return e, nil
}

// loopCount is how many event loops serve a listener with procs CPUs for
// Go: one per two CPUs. The other half is left to what a loop hands work
// to (admissions that wait, the fallback server, the lease API, the
// garbage collector) and to the service the gate sits beside. Measured on
// two CPUs shared with the client and the upstream: one loop forwarded
// about 10 % more writes than two, for a quarter less CPU per write.
func loopCount(procs int) int { return max(1, procs/2) }

// serve runs the loops until Shutdown or Close, and returns once stop has
// cleaned up after them.
func (e *loopEngine) serve() error {
	for _, l := range e.loops {
		e.wg.Go(l.run)
	}
	if e.tlsLn != nil {
		e.goTracked(workAccept, e.acceptTLS)
	}
	<-e.done
	e.doneOnce.Do(func() {}) // waits for stop's cleanup
	return nil
}

// workKind is what a goroutine of the engine's work does (see goTracked).
type workKind int

const (
	workDial      workKind = iota // dialing the upstream
	workAdmission                 // a write's admission by the store, or its wait for a turn
	workMarks                     // a mark reader opening
	workHandshake                 // a TLS handshake
	workAccept                    // a TLS listener's accept
	workHandoff                   // a connection on its way to the general path
	workSendHook                  // Gate.beforeSend (tests)
	workKinds
)

var workNames = [workKinds]string{"dials", "admissions", "mark_readers_opening", "tls_handshakes",
	"tls_accept", "handoffs", "send_hooks"}

// goTracked runs f, work of kind k, on a goroutine stop waits for.
func (e *loopEngine) goTracked(k workKind, f func()) {
	e.running[k].Add(1)
	e.work.Go(func() {
		defer e.running[k].Add(-1)
		f()
	})
}

func (e *loopEngine) stopAccepting() {
	if e.closing.Swap(true) {
		return
	}
	if e.tlsLn != nil {
		_ = e.tlsLn.Close() // ends acceptTLS
		return
	}
	for _, l := range e.loops {
		l.post(func() {
			if err := l.p.Remove(e.lnFD); err != nil {
				// The loop may be woken for connections it then
				// closes at once (accept checks closing).
				e.g.log.Warn("gate event loop: could not stop watching the listener", "error", err)
			}
		})
	}
}

// shutdown stops accepting, ends idle connections, and waits for the
// others to finish their request (see Server.Shutdown).
func (e *loopEngine) shutdown(ctx context.Context) error {
	e.stopAccepting()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		open := atomic.Int64{}
		for _, l := range e.loops {
			l.call(func() {
				l.endIdle()
				open.Add(int64(len(l.clients)))
			})
		}
		for _, h := range e.handedConns(true) {
			_ = h.Close()
		}
		e.mu.Lock()
		open.Add(int64(len(e.handed)))
		e.mu.Unlock()
		if open.Load() == 0 {
			return e.stop(ctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// close closes every connection at once and stops the loops, waiting for
// their work until ctx ends (see stop).
func (e *loopEngine) close(ctx context.Context) error {
	e.stopAccepting()
	for _, l := range e.loops {
		l.call(func() {
			for c := range l.clients {
				c.close()
			}
		})
	}
	for _, h := range e.handedConns(false) {
		_ = h.Close()
	}
	return e.stop(ctx)
}

// handedConns lists the connections served by the fallback: the idle
// ones, or all.
func (e *loopEngine) handedConns(idleOnly bool) []*handedConn {
	e.mu.Lock()
	defer e.mu.Unlock()
	var hs []*handedConn
	for h, idle := range e.handed {
		if idle || !idleOnly {
			hs = append(hs, h)
		}
	}
	return hs
}

// stop stops the loops, closes what they hold, cancels the engine's
// context (dials, admissions and waits for a turn, mark readers opening,
// handshakes) and waits for the engine's other goroutines until ctx ends.
// When they all returned in time, every connection is closed, every
// barrier place a write of the loops took is left (or held for the grace,
// as for a client gone), and every dialed descriptor is closed. When ctx
// ends first (a store or resolver that ignores cancellation), stop logs
// once what it left running and returns ctx's error: what it left can no
// longer reach a loop (a stopped loop refuses what is posted to it), so it
// forwards nothing; its poster leaves its barrier place and closes its
// descriptor when it returns, or the process's exit does. Later calls
// return nil at once.
//
// The loops themselves are waited for without a bound: they block only in
// epoll_wait, and a stopped loop returns from its next pass.
func (e *loopEngine) stop(ctx context.Context) error {
	var err error
	e.doneOnce.Do(func() {
		for _, l := range e.loops {
			l.post(func() { l.stopped = true })
		}
		e.cancel()
		close(e.done)
		e.wg.Wait()
		e.closeLoops()
		if e.lnFD >= 0 {
			unix.Close(e.lnFD)
		}
		err = e.waitWork(ctx)
	})
	return err
}

// waitWork waits for the engine's work until ctx ends; then it logs what
// is still running, once, and returns ctx's error.
func (e *loopEngine) waitWork(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		e.work.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	attrs := []any{"error", ctx.Err()}
	for k := range workKinds {
		if n := e.running[k].Load(); n > 0 {
			attrs = append(attrs, workNames[k], n)
		}
	}
	e.g.log.Warn("gate event loops stopped before their work ended; what still runs forwards nothing, and leaves its barrier places and descriptors when it returns", attrs...)
	return ctx.Err()
}

func (e *loopEngine) closeLoops() {
	for _, l := range e.loops {
		l.closeAll()
	}
}

// eventLoop is one epoll loop and the connections it owns. Only its
// goroutine touches them; other goroutines hand it work with post.
type eventLoop struct {
	e       *loopEngine
	p       *evloop.Poller // its epoll instance and inbox
	fds     map[int]fdOwner
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

	buf       []byte        // one read
	rd        bytes.Reader  // parsing: a head's bytes...
	br        *bufio.Reader // ...as fasthttp reads them
	hdr       http.Header   // the headers decide reads, reused (see decisionHeader)
	head      h1.Request    // the request head parsed last (parseHead), reused
	lastSweep time.Time
	lastYield time.Time   // when the loop last went through the Go scheduler (see loopYield)
	cur       *loopConn   // the connection the current step serves (loopguard_linux.go)
	touched   []*loopConn // the connections the current pass touched
	resp      h1.Response // the response head parsed last (readResponse), reused
}

// fdOwner is a socket of a loop: a client or an upstream connection.
type fdOwner interface{ ready(events uint32) }

func newEventLoop(e *loopEngine) (*eventLoop, error) {
	p, err := evloop.New()
	if err != nil {
		return nil, err
	}
	l := &eventLoop{e: e, p: p, fds: make(map[int]fdOwner), clients: make(map[*loopConn]struct{}),
		buf: make([]byte, loopReadBuffer), exited: make(chan struct{})}
	l.pool.l = l
	l.br = bufio.NewReaderSize(&l.rd, upstreamReadBuffer+1)
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
	for !l.stopped {
		n, err := l.p.Wait(events, loopTick)
		if err != nil {
			l.e.g.log.Error("gate event loop failed", "error", err)
			return
		}
		l.pass(events[:n])
		if l.now.Sub(l.lastYield) >= loopYield { // after the pass's writes went out
			l.lastYield = l.now
			runtime.Gosched()
		}
	}
}

// pass moves on what the events and the inbox make ready, each socket's
// event, posted function, deadline and queued write a step of its own
// (see loopguard_linux.go: a panic in one closes the connections it
// touched, and the pass goes on).
func (l *eventLoop) pass(events []unix.EpollEvent) {
	l.now = time.Now()
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
			if o := l.fds[fd]; o != nil {
				l.step(func() { o.ready(events[i].Events) })
			}
		}
	}
	l.runInbox()
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

// runInbox runs what was posted.
func (l *eventLoop) runInbox() {
	for _, f := range l.p.Take() {
		l.step(f)
	}
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
	if tlsState != nil {
		c.ctx.Init2(loopTLSConn{c}, nil, false) // IsTLS: X-Forwarded-Proto https
	} else {
		c.ctx.Init2(c, nil, false)
	}
	c.enter(stHead)
	l.clients[c] = struct{}{}
	l.fds[fd] = c
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

// handoff gives c's connection, with the bytes it sent that the loop has
// not consumed, to the fallback fasthttp server, which serves it from now
// on.
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
	l.e.handed[h] = false
	l.e.mu.Unlock()
	l.e.goTracked(workHandoff, func() { l.e.s.serveHanded(h) })
}

// forget drops c from the loop's tables.
func (l *eventLoop) forget(c *loopConn) {
	delete(l.clients, c)
	delete(l.fds, c.FD)
	l.pool.unqueue(c)
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

// setIdle records whether h waits between requests (the fallback's
// ConnState), so Shutdown can end it.
func (e *loopEngine) setIdle(c net.Conn, idle bool) {
	h, ok := c.(*handedConn)
	if !ok {
		return
	}
	e.mu.Lock()
	if _, open := e.handed[h]; open {
		e.handed[h] = idle
	}
	e.mu.Unlock()
	if idle && e.closing.Load() {
		_ = h.Close()
	}
}

var (
	errUpstreamClosed = errors.New("the upstream closed the connection before answering")
	errUpstreamHead   = errors.New("the upstream's response head is malformed or too large")
	errUpstreamBody   = errors.New("the upstream's response body is malformed")
)
