// Package loglimit bounds how many lines of one kind a process logs per
// second, so that a flood of requests (refused writes at the gate, refused
// calls on the lease API) cannot flood the log or fill its disk.
//
// A Limiter lets the first PerSecond events of each wall-clock second
// through and counts the rest; the next event let through learns how many
// were dropped since the one before it, to be logged with it (as a
// "suppressed" attribute). Nothing is buffered or delayed: an event is
// either logged at once or only counted.
package loglimit

import (
	"math"
	"sync/atomic"
	"time"
)

// Limiter is a per-second budget of log lines. Set PerSecond before first
// use; the rest of its zero value is ready. Its fields are plain integers
// used atomically (not atomic types), so a Limiter can be copied by value
// into an options struct before it is used; once in use it must not be
// copied. Allow is safe for concurrent use.
type Limiter struct {
	// PerSecond is how many events a second Allow lets through; 0 or less
	// lets none through (everything is counted as suppressed). Budgets
	// above math.MaxUint32 count as math.MaxUint32.
	PerSecond int64

	// window holds the second being counted (its Unix time's low 31
	// bits, in the high half) and how many events it let through (the
	// low half), in one word: a new second's reset and its first event
	// are one compare-and-swap, so no event can slip in between them.
	window     uint64
	suppressed int64
}

// Allow reports whether an event at now may be logged, and if so how many
// events were suppressed since the last one allowed (to be logged with
// it). The budget restarts at each new second of now's Unix time.
func (l *Limiter) Allow(now time.Time) (ok bool, suppressed int64) {
	budget := uint64(min(max(l.PerSecond, 0), math.MaxUint32))
	sec := uint64(now.Unix()) & math.MaxInt32
	for {
		old := atomic.LoadUint64(&l.window)
		n := old & math.MaxUint32
		if old>>32 != sec {
			n = 0
		}
		if n >= budget {
			atomic.AddInt64(&l.suppressed, 1)
			return false, 0
		}
		if atomic.CompareAndSwapUint64(&l.window, old, sec<<32|(n+1)) {
			return true, atomic.SwapInt64(&l.suppressed, 0)
		}
	}
}
