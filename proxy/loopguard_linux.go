//go:build linux

package proxy

import (
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing"
)

// A loop contains a panic in its own code (a defect: the byte helpers are
// fuzzed, but a defect elsewhere must not end the process, whose lease API
// every lease holder relies on). Each step of a pass (one socket's event,
// one posted function, one deadline, one queued write, one request
// forwarded at the end of the pass) runs under step, which recovers a
// panic and closes the connection the step served; a panic outside any
// step closes every connection the pass touched. Either way the cause is
// logged with the request ids of the connections closed, MetricPanics
// counts it, and the loop goes on with its next step: every other
// connection, the fallback server and the lease API keep serving. A
// closed connection ends as a client hang-up does: an admitted write that
// may be in the upstream holds its barrier place for the grace period, its
// upstream connection is closed, never reused.
//
// The goroutine that opens a loop's mark reader contains a panic in the
// store's code the same way (openMarkReader): counted, logged with its
// cause, and a failed open, so the loop admits through the worker and
// opens a reader again later. The engine's other goroutines (dials,
// admissions, handshakes, handoffs) do not: each owes a loop or a
// connection a result, and a recovered panic would leave it waiting for
// one that never comes.

// loopPanicHook, set by tests only, runs when a loop connection's request
// is decided (start): a test provokes a panic there. Atomic, as loops of
// other tests' gates may still be running when a test sets it.
var loopPanicHook atomic.Pointer[func(c *loopConn)]

// touch records c as the connection the current step serves, and as one
// the pass touched.
func (l *eventLoop) touch(c *loopConn) {
	l.cur = c
	if !c.touched {
		c.touched = true
		l.touched = append(l.touched, c)
	}
}

// step runs f, one step of the pass, containing a panic in it.
func (l *eventLoop) step(f func()) {
	l.cur = nil
	defer l.containStep()
	f()
}

// containStep recovers a step's panic: the connection it served closes.
func (l *eventLoop) containStep() {
	if r := recover(); r != nil {
		var victims []*loopConn
		if l.cur != nil {
			victims = append(victims, l.cur)
		}
		l.panicked(r, victims)
	}
}

// containPass recovers a panic outside the steps of a pass: every
// connection the pass touched closes.
func (l *eventLoop) containPass() {
	if r := recover(); r != nil {
		l.panicked(r, l.touched)
	}
}

// endPass forgets the connections the pass touched.
func (l *eventLoop) endPass() {
	for i, c := range l.touched {
		c.touched = false
		l.touched[i] = nil
	}
	l.touched = l.touched[:0]
	l.cur = nil
}

// panicked counts and logs a contained panic and closes victims.
func (l *eventLoop) panicked(cause any, victims []*loopConn) {
	g := l.e.g
	g.tel.panics.Add(1)
	ids := make([]string, 0, len(victims))
	for _, c := range victims {
		if c.x != nil {
			ids = append(ids, c.x.id)
		}
	}
	g.log.Error("gate event loop: contained a panic; the connections its step touched are closed",
		"panic", fmt.Sprint(cause), "request_ids", ids, "connections", len(victims), "stack", string(debug.Stack()))
	for _, c := range victims {
		l.abandon(c)
	}
	l.cur = nil
}

// abandon closes c after a panic. Should closing it in order panic too
// (its state is broken), it is dropped from the loop and its descriptor
// closed, so no later event reaches it.
func (l *eventLoop) abandon(c *loopConn) {
	defer func() {
		if r := recover(); r != nil {
			l.e.g.log.Error("gate event loop: closing a connection after a panic panicked; dropped", "panic", fmt.Sprint(r))
			l.forget(c)
			if !c.fdClosed {
				c.fdClosed = true
				_ = l.p.Remove(c.FD)
				unix.Close(c.FD)
			}
		}
	}()
	c.close()
}

// openMarkReader opens one of stores' mark readers for l, on the opening
// goroutine (loopMarks.open), containing a panic in it as a failed open.
func (l *eventLoop) openMarkReader(stores fencing.MarkReaders) (r fencing.MarkReader, err error) {
	defer func() {
		if p := recover(); p != nil {
			l.e.g.tel.panics.Add(1)
			l.e.g.log.Error("gate event loop: contained a panic opening the store's mark reader; it counts as a failed open",
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			r, err = nil, fmt.Errorf("opening the store's mark reader panicked: %v", p)
		}
	}()
	return stores.OpenMarkReader(l.e.ctx)
}
