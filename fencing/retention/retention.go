// Package retention runs the background sweep of stores that remove idle
// records themselves (DESIGN §12): one pass at a time, at an interval, each
// pass working through the store in bounded batches so that it never holds
// the store's lock or write transaction for long, and counts what it did.
// It also keeps a store's token clock, which never runs backwards.
package retention

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// DefaultBatch is how many records a pass examines per lock or
// transaction when a store's options leave it zero.
const DefaultBatch = 1000

// Interval is how often a store sweeps for retention r: a tenth of it,
// between one second and ten minutes, so a record outlives its retention by
// at most about a tenth.
func Interval(r time.Duration) time.Duration {
	return min(max(r/10, time.Second), 10*time.Minute)
}

// Stats are a store's retention counters. Safe for concurrent use.
type Stats struct {
	removed, sweeps, behind atomic.Uint64
	nanos                   atomic.Int64
}

// Removed counts n records removed.
func (s *Stats) Removed(n int) { s.removed.Add(uint64(n)) }

// ClockBehind counts one reading of a store's clock found behind tokens
// it had issued.
func (s *Stats) ClockBehind() { s.behind.Add(1) }

// Swept counts one pass that took d.
func (s *Stats) Swept(d time.Duration) {
	s.sweeps.Add(1)
	s.nanos.Add(int64(d))
}

// Snapshot returns the counters for fencing.Retainer.
func (s *Stats) Snapshot() fencing.RetentionStats {
	return fencing.RetentionStats{Removed: s.removed.Load(), Sweeps: s.sweeps.Load(),
		SweepTime: time.Duration(s.nanos.Load()), ClockBehind: s.behind.Load()}
}

// Clock is a store's token clock (DESIGN §12): readings in Unix µs that
// never go backwards. A reading of the host clock behind the latest one
// used is counted (Stats.ClockBehind) and replaced by that latest one, so
// tokens keep rising while the clock catches up. Safe for concurrent use.
type Clock struct {
	last  atomic.Int64
	stats *Stats
}

// NewClock returns a token clock counting steps back in stats (nil: not
// counted).
func NewClock(stats *Stats) *Clock { return &Clock{stats: stats} }

// Read reads host and returns max(its reading in µs, the latest reading),
// raising the latest. It reads host itself, after loading the latest: a
// reading behind a latest loaded before it is a real step back of the
// clock (or a Raise above it) and is counted; a reading behind one that
// a concurrent caller took later and stored first is not, since the
// clock did not step (it is the order of two callers, not of the clock).
func (c *Clock) Read(host fencing.Clock) fencing.Token {
	last := c.last.Load()
	us := max(host.Now().UnixMicro(), 0)
	if us < last && c.stats != nil {
		c.stats.behind.Add(1)
	}
	for {
		if us <= last {
			return fencing.Token(last)
		}
		if c.last.CompareAndSwap(last, us) {
			return fencing.Token(us)
		}
		last = c.last.Load()
	}
}

// Raise makes every later reading at least v (a store that knows it
// issued tokens up to v-1, as the file store does from its lineage).
func (c *Clock) Raise(v fencing.Token) {
	for {
		last := c.last.Load()
		if int64(v) <= last || c.last.CompareAndSwap(last, int64(v)) {
			return
		}
	}
}

// Pass is one sweep pass over a store: it removes idle records in bounded
// batches and reports how many.
type Pass func(ctx context.Context) (removed int, err error)

// Loop runs a store's sweep in the background.
type Loop struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start runs pass every interval until Stop, counting into stats; a pass
// that fails is logged (when log is not nil) and tried again at the next
// interval.
func Start(interval time.Duration, pass Pass, stats *Stats, log *slog.Logger) *Loop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loop{cancel: cancel}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := Run(ctx, pass, stats); err != nil && ctx.Err() == nil && log != nil {
				log.Warn("retention sweep failed; trying again later", "err", err)
			}
		}
	}()
	return l
}

// Run runs one pass now and counts it into stats.
func Run(ctx context.Context, pass Pass, stats *Stats) (int, error) {
	start := time.Now()
	n, err := pass(ctx)
	stats.Removed(n)
	if err == nil {
		stats.Swept(time.Since(start))
	}
	return n, err
}

// Stop ends the loop and waits for a running pass to return. Safe to call
// on a nil Loop and more than once.
func (l *Loop) Stop() {
	if l == nil {
		return
	}
	l.cancel()
	l.wg.Wait()
}
