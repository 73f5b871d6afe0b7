// Package fencingtest is the conformance suite every fencing.Store runs.
//
// A store's test calls Run with a Harness that opens fresh, empty stores;
// the suite then checks the contract of fencing.Store (token monotonicity,
// lease semantics, atomic admission, checkpoints, bounds) in named subtests.
// RunBenchmarks measures the hot paths with the same Harness.
// RunSharedBarrier checks the contract of fencing.SharedBarrier (several
// gates over one shared store) with a BarrierHarness.
//
// Stores that own time (memory, file) pass a FakeClock and set
// Instance.Advance, so expiry is tested without sleeping. Stores whose time
// is not injectable (Valkey uses the server's TIME) leave Advance nil: the
// suite then uses the shortest TTL (1 s) where it needs expiry and sleeps
// past it, and compares times only by ordering and ranges.
//
// The suite uses only errors.Is and errors.As on the store's errors, never
// their text, and calls t.Fatal only from the test's own goroutine.
package fencingtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// Harness opens stores for the suite.
type Harness struct {
	// Open returns a fresh, empty store (its own namespace: no resource
	// of another Open is visible) and registers its cleanup with t. The
	// suite may Close the store itself; a second Close in cleanup must be
	// harmless.
	Open func(t testing.TB) Instance
	// MaxCheckpointBytes is the checkpoint state limit the stores were
	// opened with; 0 means fencing.DefaultMaxCheckpointBytes.
	MaxCheckpointBytes int
}

// Instance is one opened store and the controls the suite needs over it.
type Instance struct {
	// Store is the store under test.
	Store fencing.Store
	// Advance moves the store's clock forward by d. Nil means the store
	// uses a real clock: the suite then sleeps instead, using the minimum
	// TTL of 1 s and sleeping about 1.2 s (few such cases).
	Advance func(d time.Duration)
	// Reopen closes the store and opens it again over the same persisted
	// state, returning the new store (the suite uses it from then on). Nil
	// when the store keeps nothing across a reopen (memory); the cases that
	// need it are skipped.
	Reopen func(t testing.TB) fencing.Store
	// ClockTokens says the store issues tokens on its clock (DESIGN §12):
	// max(issued+1, clock in µs), a fresh record starting with its
	// high-water mark at the clock, and a token below the clock refused
	// as stale on a resource with no record. The clock cases need it.
	ClockTokens bool
	// Retention is the retention the store was opened with (0: none; the
	// retention cases are skipped). With a fake clock it should be an
	// hour or so, with a real one about a second.
	Retention time.Duration
	// Sweep runs one retention pass now. Nil for a store whose records
	// expire by themselves (Valkey keys): the suite then waits past the
	// retention instead.
	Sweep func(ctx context.Context) (int, error)
	// Delete removes a resource's record and checkpoint from the store,
	// as its retention (or an operator) would, without going through the
	// store's API. Nil when the harness cannot: the DeletedRecord case is
	// skipped.
	Delete func(t testing.TB, resource string)
	// Rewind moves the store's clock back by d (a clock stepped back).
	// Nil when the store's clock cannot be moved: that case is skipped.
	Rewind func(d time.Duration)
	// Backup copies the store's persisted state (a backup taken now) and
	// returns restore, which closes the store, puts the copy back in place
	// of what is there then (as an operator restoring last week's backup
	// would, with whatever the store keeps beside its data) and opens the
	// store again. Nil when the store has no such copy to take.
	Backup func(t testing.TB) (restore func(t testing.TB) fencing.Store)
}

// FakeClock is a fencing.Clock that moves only when told. Safe for
// concurrent use.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

var _ fencing.Clock = (*FakeClock)(nil)

// NewFakeClock returns a clock that reads start until advanced.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's current time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Rewind moves the clock back by d (a clock stepped back, as an NTP step
// or a restored VM makes it): the clock cases use it.
func (c *FakeClock) Rewind(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(-d)
}

// Advance moves the clock forward by d (negative d is ignored: use
// Rewind).
func (c *FakeClock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
