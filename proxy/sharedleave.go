package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fencegate/fencegate/fencing"
)

// Metrics of the shared barrier's removals, exported to Prometheus as
// fencegate_gate_shared_barrier_leave_retries_total and
// fencegate_gate_shared_barrier_leaves_abandoned_total.
const (
	// MetricSharedLeaveRetries counts the attempts, after a first one
	// failed, to remove the entry of a write that has ended, by outcome:
	// removed or failed.
	MetricSharedLeaveRetries = "fencegate.gate.shared_barrier.leave_retries"
	// MetricSharedLeavesAbandoned counts the entries whose removal failed
	// and that this gate stopped trying to remove, by reason: expired (the
	// entry's lifetime passed: the store ignores it now), stopping (the
	// gate stopped), queue-full (leaveQueueMax removals were already
	// waiting) or refused (the store refused the removal: no store fault,
	// so a retry would be refused too). Such an entry stays until its
	// deadline.
	MetricSharedLeavesAbandoned = "fencegate.gate.shared_barrier.leaves_abandoned"
)

// attrReason is the reason attribute of MetricSharedLeavesAbandoned.
var attrReason = attribute.Key("reason")

const (
	// leaveTimeout bounds one attempt to remove an entry.
	leaveTimeout = 5 * time.Second
	// leaveQueueMax bounds the removals waiting for a retry; a removal
	// failing beyond it is abandoned (queue-full): its entry stays until
	// its deadline.
	leaveQueueMax = 10_000
	// leaveRetryMin and leaveRetryMax bound the backoff between retries:
	// it doubles after each failed retry, from leaveRetryMin, and starts
	// again from leaveRetryMin after a success.
	leaveRetryMin = 50 * time.Millisecond
	leaveRetryMax = 2 * time.Second
)

// leaver removes the shared-barrier entries of writes that have ended. The
// first attempt runs at once on its own goroutine, so the request's
// completion never waits for the store. An attempt that fails with a store
// fault (the store restarting, a network blip) is queued for a single retry
// worker, which tries again with backoff until the removal succeeds, the
// entry's lifetime has passed (the store ignores the entry from then on),
// or the gate stops. At most leaveQueueMax removals wait; beyond that a
// failed removal is abandoned, counted and logged. The worker runs only
// while removals wait. close waits for every goroutine the leaver started,
// cancelling the attempts in flight when its context ends.
type leaver struct {
	sb        fencing.SharedBarrier
	log       *slog.Logger
	retries   metric.Int64Counter
	abandoned metric.Int64Counter

	stop  context.Context // ended by close: the retries stop
	halt  context.CancelFunc
	cut   context.Context // ended when close's ctx ends: the first attempts in flight stop
	abort context.CancelFunc
	wg    sync.WaitGroup // first attempts and the retry worker

	mu      sync.Mutex
	closed  bool
	left    int            // removals abandoned as stopping while close ran, for its log
	running bool           // the retry worker runs
	pending []pendingLeave // removals waiting for a retry, in the order they are tried
	full    bool           // a removal was abandoned as queue-full since the queue last emptied

	rounds   atomic.Int64 // retry rounds run, for tests and the log
	attempts atomic.Int64 // first attempts running, for tests
}

// pendingLeave is a removal waiting for a retry.
type pendingLeave struct {
	e     fencing.BarrierEntry
	until time.Time // the entry's lifetime ends: no retry after it
}

func newLeaver(sb fencing.SharedBarrier, log *slog.Logger, m metric.Meter) (*leaver, error) {
	l := &leaver{sb: sb, log: log}
	l.stop, l.halt = context.WithCancel(context.Background())
	l.cut, l.abort = context.WithCancel(context.Background())
	var err1, err2 error
	l.retries, err1 = m.Int64Counter(MetricSharedLeaveRetries, metric.WithUnit("{attempt}"),
		metric.WithDescription("Retried removals of shared-barrier entries whose first removal failed, by outcome."))
	l.abandoned, err2 = m.Int64Counter(MetricSharedLeavesAbandoned, metric.WithUnit("{entry}"),
		metric.WithDescription("Shared-barrier entries whose removal failed and was given up (they stay until their deadline), by reason."))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("proxy: creating the shared barrier's removal metrics: %w", err)
	}
	return l, nil
}

// leave removes e, whose lifetime ends at until (by this host's monotonic
// clock), in the background. After close it does nothing: the entry stays
// until its deadline, like the entries of writes cut off at the stop.
func (l *leaver) leave(e fencing.BarrierEntry, until time.Time) {
	l.mu.Lock()
	if l.closed {
		l.left++
		l.mu.Unlock()
		l.abandon("stopping", 1)
		return
	}
	l.wg.Add(1)
	l.attempts.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		defer l.attempts.Add(-1)
		ctx, cancel := context.WithTimeout(l.cut, leaveTimeout)
		err := l.sb.Leave(ctx, e)
		cancel()
		if err == nil {
			return
		}
		if l.cut.Err() != nil {
			l.stopping(1) // cut off by close: the entry stays until its deadline
			return
		}
		if !fencing.IsStoreFault(err) {
			l.refused(e, err)
			return
		}
		l.queue(pendingLeave{e: e, until: until}, err)
	}()
}

// queue hands a removal whose attempt failed with err to the retry
// worker, starting it if it is not running.
func (l *leaver) queue(p pendingLeave, err error) {
	l.mu.Lock()
	switch {
	case l.closed:
		l.left++
		l.mu.Unlock()
		l.abandon("stopping", 1)
		return
	case !time.Now().Before(p.until):
		l.mu.Unlock()
		l.abandon("expired", 1)
		return
	case len(l.pending) >= leaveQueueMax:
		first := !l.full
		l.full = true
		l.mu.Unlock()
		if first {
			l.log.Warn("shared barrier: too many entries wait for their removal to be retried; entries failing now stay until their deadlines",
				slog.Int("waiting", leaveQueueMax))
		}
		l.abandon("queue-full", 1)
		return
	}
	l.pending = append(l.pending, p)
	start := !l.running
	if start {
		l.running = true
		l.wg.Add(1)
	}
	l.mu.Unlock()
	if start {
		l.log.Warn("shared barrier: removing an entry failed; retrying in the background until it is removed or its deadline passes",
			slog.String("resource", p.e.Resource), slog.String("entry", p.e.ID), slog.Any("error", err))
		go l.retry()
	}
}

// refused logs and counts a removal the store refused without a fault: a
// retry would be refused too.
func (l *leaver) refused(e fencing.BarrierEntry, err error) {
	l.log.Warn("shared barrier: the store refused to remove an entry; it stays until its deadline",
		slog.String("resource", e.Resource), slog.String("entry", e.ID), slog.Any("error", err))
	l.abandon("refused", 1)
}

// stopping counts n removals given up because the gate stops, for close's
// log.
func (l *leaver) stopping(n int) {
	l.mu.Lock()
	l.left += n
	l.mu.Unlock()
	l.abandon("stopping", n)
}

// abandon counts n removals given up for reason.
func (l *leaver) abandon(reason string, n int) {
	if n > 0 {
		l.abandoned.Add(context.Background(), int64(n), metric.WithAttributes(attrReason.String(reason)))
	}
}

// retry is the retry worker: it retries the waiting removals in rounds
// (round), one at a time. A round without a success and with a store fault
// doubles the backoff; any success resets it. It returns when no removal
// waits, or when the gate stops (the removals still waiting are
// abandoned).
func (l *leaver) retry() {
	defer l.wg.Done()
	delay := leaveRetryMin
	timer := time.NewTimer(spread(delay))
	defer timer.Stop()
	removed := 0
	for {
		select {
		case <-l.stop.Done():
			l.mu.Lock()
			n := len(l.pending)
			l.pending, l.running = nil, false
			l.left += n
			l.mu.Unlock()
			l.abandon("stopping", n)
			return
		case <-timer.C:
		}
		ok, n := l.round()
		removed += n
		if ok {
			delay = leaveRetryMin
		} else {
			delay = min(2*delay, leaveRetryMax)
		}
		l.mu.Lock()
		if len(l.pending) == 0 {
			l.running, l.full = false, false
			l.mu.Unlock()
			l.log.Info("shared barrier: the retried removals are over", slog.Int("removed", removed))
			return
		}
		l.mu.Unlock()
		timer.Reset(spread(delay))
	}
}

// leaveFaultsPerRound ends a retry round after this many store faults in
// a row: with the whole store down a round costs a few attempts, not one
// per waiting removal, while removals on a part of the store that is back
// (another shard of a cluster) behind stuck ones are still reached within
// a few rounds.
const leaveFaultsPerRound = 8

// round tries each removal waiting at its start once, oldest first: one
// that fails with a store fault goes to the back of the queue, and the
// round ends after leaveFaultsPerRound faults in a row. It drops those
// whose lifetime has passed. It reports whether a retry succeeded or none
// failed (the backoff starts again) and how many it removed.
func (l *leaver) round() (ok bool, removed int) {
	l.rounds.Add(1)
	l.mu.Lock()
	left := len(l.pending)
	l.mu.Unlock()
	faults, failed := 0, false
	for ; left > 0 && faults < leaveFaultsPerRound; left-- {
		l.mu.Lock()
		if len(l.pending) == 0 {
			l.pending = nil
			l.mu.Unlock()
			break
		}
		p := l.pending[0]
		if !time.Now().Before(p.until) {
			l.pending = l.pending[1:] // only the worker removes from the front
			l.mu.Unlock()
			l.abandon("expired", 1)
			continue
		}
		l.mu.Unlock()

		ctx, cancel := context.WithTimeout(l.stop, leaveTimeout)
		err := l.sb.Leave(ctx, p.e)
		cancel()
		if l.stop.Err() != nil {
			return false, removed // the removal stays pending: the worker abandons it
		}
		outcome := "removed"
		if err != nil {
			outcome = "failed"
		}
		l.retries.Add(context.Background(), 1, metric.WithAttributes(attrOutcome.String(outcome)))
		l.mu.Lock()
		l.pending = l.pending[1:]
		if err != nil && fencing.IsStoreFault(err) {
			// To the back: the next attempt is for the next removal, which
			// may be on a part of the store that is back.
			l.pending = append(l.pending, p)
			l.mu.Unlock()
			faults++
			failed = true
			continue
		}
		l.mu.Unlock()
		faults = 0
		if err != nil {
			l.refused(p.e, err)
			continue
		}
		removed++
	}
	return removed > 0 || !failed, removed
}

// close stops the retries (the removals waiting for one are abandoned)
// and waits for the first attempts still running, each bounded by
// leaveTimeout; then every goroutine the leaver started has returned. When
// ctx ends first, it cancels those attempts (their entries stay until
// their deadlines) and returns ctx's error at once, without waiting for
// them: Leave honours its context, but a store client may not while it
// opens a connection (valkey-go's handshake on a new connection waits for
// its own timeout), and close must not outlast ctx. An attempt still
// running then counts itself as stopping when it returns (or removes its
// entry, if the store answers first). The removals given up are counted
// as stopping and logged once, with the attempts still running.
func (l *leaver) close(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.halt()
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	l.abort()
	l.mu.Lock()
	n := l.left
	l.mu.Unlock()
	if running := l.attempts.Load(); n > 0 || running > 0 {
		l.log.Warn("shared barrier: the gate stopped before the removal of some entries of ended writes; they stay until their deadlines",
			slog.Int("entries", n), slog.Int64("removals_in_flight", running))
	}
	return err
}

// spread is d plus or minus up to a quarter, so that gates that lost the
// store together do not retry in step.
func spread(d time.Duration) time.Duration {
	return d - d/4 + rand.N(d/2+1)
}
