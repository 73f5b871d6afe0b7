//go:build linux

package proxy

import (
	"context"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The event-loop engine serves a gate's TCP listener on Linux without a
// goroutine per connection or per request: one epoll loop per CPU owns its
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
// The loops forward only the plainest requests, and only after internal/h1's
// strict parser, which accepts only heads net/http reads the same way, has
// read their head into the request the gate decides on (loopRequest):
// HTTP/1.1, strict CRLF line ends, a head under MaxHeaderBytes, no
// Transfer-Encoding, no Upgrade or Expect, a Content-Length body of at most
// Options.BodyBuffer bytes, an http upstream. Anything else (a malformed
// head, a large or chunked body, an upgrade) hands the connection, with the
// bytes it sent so far, to the general engine (net/http's server,
// httpengine.go), which serves it from then on: a shape the loops do not
// take is judged by one parser and one set of handlers. The request sent
// upstream is built by appendUpstreamHead, which TestUpstreamHeadAgrees
// holds to what the general engine sends for the same request.

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

// loopTick is how often a busy loop checks its deadlines: a timeout fires
// up to this late.
const loopTick = 20 * time.Millisecond

// loopIdleMax is the longest a loop sleeps when nothing is ready and no
// deadline comes sooner (see eventLoop.idleWait). An idle gate's loop then
// wakes once a second, not fifty times: each wait longer than 10 ms hands
// the loop's processor back to the runtime, whose monitor (sysmon) then
// polls every 20 µs for a millisecond and more. Measured on a gate idle
// after load, with five keep-alive clients open, over 10 s: 7.7 % of a CPU
// and 31,116 thread wake-ups when every wait was loopTick, 0.1 % and 623
// now (docs/loops.md, "Threads").
const loopIdleMax = time.Second

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
	handed map[*handedConn]struct{} // connections served by the general engine (net/http ends them on Shutdown)
}

// count is how many event loops the engine runs.
func (e *loopEngine) count() int { return len(e.loops) }

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
		handed: make(map[*handedConn]struct{})}
	if s.tls != nil {
		e.tlsLn = ln
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	n := loopCount(s.loopsWanted, cpuProcs())
	for range n {
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
	if s.spareProcessor {
		spareProcessor(n)
	}
	return e, nil
}

// loopCount is how many event loops serve a listener: wanted
// (ServerOptions.Loops, FENCEGATE_LOOPS) when set, else one per CPU Go
// uses (procs: GOMAXPROCS without the spare processor, cpuProcs), as
// nginx, HAProxy and Envoy run one worker per CPU. On two CPUs shared with
// the client and the upstream, once idle loops stopped waking every 20 ms,
// two loops forwarded 1.09 to 1.24 x what one did on the local stores at
// 50 connections and 1.26 x at 1,000, for about the same CPU per write (7
// % less to 3 % more), the same latency at one connection and the same
// memory; on Valkey beside its server on those CPUs, as much as one for
// more CPU, and 1.08 x once the loops had a processor to spare
// (spareProcessor; docs/performance.md has the runs). FENCEGATE_LOOPS set
// lower leaves CPUs to the service the gate sits beside.
func loopCount(wanted, procs int) int {
	if wanted > 0 {
		return wanted
	}
	return max(1, procs)
}

// spareProcessor makes the Go runtime's processors (GOMAXPROCS) one more
// than the n loops hold, when they are not more already and the GOMAXPROCS
// environment variable (an operator's choice) is unset. Each loop keeps a
// processor while it runs and while it sleeps in epoll_wait; with every
// processor a loop's, the gate's other goroutines (admissions that write
// to the store, the barrier's waiters, the lease API, the collector) run
// only once the runtime's monitor takes a sleeping loop's processor from
// its system call (20 µs to 10 ms later), and each such take hands the
// processor to another thread and brings the monitor back to polling
// every 20 µs. With one processor to spare none of that happens: on 2
// CPUs at 50 connections, 6 % less of the gate's CPU a write on the
// memory store and 14 % less on Valkey, and the other goroutines' wait for
// a processor at p99 0.3 to 0.5 ms instead of 1.6 to 5.2
// (docs/loops.md, "Threads"). Setting GOMAXPROCS stops the runtime from
// following a change of the container's CPU limit, which the loops, one
// per processor at start, do not follow either.
func spareProcessor(n int) {
	spare.Lock()
	defer spare.Unlock()
	if procs := runtime.GOMAXPROCS(0); os.Getenv("GOMAXPROCS") == "" && procs <= n {
		if procs != spare.set {
			spare.before = procs // not a count of spareProcessor's own
		}
		spare.set = n + 1
		runtime.GOMAXPROCS(n + 1)
	}
}

// spare remembers what spareProcessor last set GOMAXPROCS to and what it
// was before, so that the loops of a listener started later in the
// process are counted from the CPUs, not from the spare processor.
var spare struct {
	sync.Mutex
	before, set int // 0: never raised
}

// cpuProcs is GOMAXPROCS without the spare processor: the processors Go
// would use, one loop each (loopCount). A GOMAXPROCS that the program
// set since is taken as it is.
func cpuProcs() int {
	spare.Lock()
	defer spare.Unlock()
	if procs := runtime.GOMAXPROCS(0); procs != spare.set {
		return procs
	}
	return spare.before
}

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
		l.call(func() {
			if err := l.p.Remove(e.lnFD); err != nil {
				// The loop may be woken for connections it then
				// closes at once (accept checks closing).
				e.g.log.Warn("gate event loop: could not stop watching the listener", "error", err)
			}
		})
	}
	// No loop watches the listener now. Shut it, as a closed listener is:
	// the kernel refuses new connections at once, and resets those it
	// had queued (none of their bytes was read), instead of queueing them
	// unanswered until the engine stops. The descriptor stays open until
	// stop, so that its number is not reused under a loop meanwhile.
	if err := unix.Shutdown(e.lnFD, unix.SHUT_RD); err != nil {
		e.g.log.Warn("gate event loop: could not shut the listener", "error", err)
	}
}

// shutdown stops accepting, ends idle connections, and waits for the
// others to finish their request, and for the connections handed to the
// general engine to be closed by it (see Server.Shutdown).
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
	for _, h := range e.handedConns() {
		_ = h.Close()
	}
	return e.stop(ctx)
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
