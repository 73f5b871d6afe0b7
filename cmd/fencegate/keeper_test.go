package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// fakeClock moves only when advanced. It knows its pending timers, so a
// test can wait until the code under test is parked on one and see when
// it will wake.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	changed chan struct{} // closed and replaced on every change
}

type fakeTimer struct {
	clock *fakeClock
	at    time.Time
	c     chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), changed: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{clock: c, at: c.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- c.now
		return t
	}
	c.timers = append(c.timers, t)
	c.notify()
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, o := range c.timers {
		if o == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			c.notify()
			return true
		}
	}
	return false
}

func (c *fakeClock) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Advance moves the clock and fires every timer now due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
		} else {
			t.c <- c.now
		}
	}
	c.timers = kept
	c.notify()
}

// waitWakes waits until the pending timers fire at exactly the instants
// accept approves (earliest first), and returns them; after 30 s it fails
// the test with the last instants seen.
func (c *fakeClock) waitWakes(t *testing.T, accept func([]time.Time) bool) []time.Time {
	t.Helper()
	limit := time.After(30 * time.Second)
	for {
		c.mu.Lock()
		ch := c.changed
		at := make([]time.Time, len(c.timers))
		for i, tm := range c.timers {
			at[i] = tm.at
		}
		c.mu.Unlock()
		sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
		if accept(at) {
			return at
		}
		select {
		case <-ch:
		case <-limit:
			t.Fatalf("pending timers %v never accepted", at)
		}
	}
}

// scriptedRenewer hands every renewal to the test, which answers it.
type scriptedRenewer struct {
	calls chan renewCall
}

type renewCall struct {
	ctx    context.Context
	token  fencing.Token
	ttl    time.Duration
	answer chan error
}

func (r *scriptedRenewer) Renew(ctx context.Context, resource, owner string, token fencing.Token, ttl time.Duration) (fencing.Lease, error) {
	c := renewCall{ctx: ctx, token: token, ttl: ttl, answer: make(chan error, 1)}
	r.calls <- c
	select {
	case err := <-c.answer:
		return fencing.Lease{}, err
	case <-ctx.Done():
		return fencing.Lease{}, ctx.Err()
	}
}

type keeperRig struct {
	t      *testing.T
	clock  *fakeClock
	r      *scriptedRenewer
	start  time.Time
	done   chan struct{} // closed when keep returned; err is then set
	err    error
	cancel context.CancelFunc
}

// newKeeperRig starts a keeper of a 30 s lease acquired (request sent)
// at the clock's start.
func newKeeperRig(t *testing.T) *keeperRig {
	clk := newFakeClock()
	r := &scriptedRenewer{calls: make(chan renewCall)}
	k := &leaseKeeper{client: r, clock: clk, resource: "job:1", owner: "w", token: 7, ttl: 30 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	rig := &keeperRig{t: t, clock: clk, r: r, start: clk.Now(), done: make(chan struct{}), cancel: cancel}
	go func() {
		rig.err = k.keep(ctx, rig.start)
		close(rig.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-rig.done
	})
	// Advancing the clock before the keeper set its first timer would
	// move that timer too.
	rig.parkedUntil(10 * time.Second)
	return rig
}

// at is the instant d after the acquisition was sent.
func (g *keeperRig) at(d time.Duration) time.Time { return g.start.Add(d) }

// parkedUntil asserts the keeper waits on exactly the given instants.
func (g *keeperRig) parkedUntil(want ...time.Duration) {
	g.t.Helper()
	g.clock.waitWakes(g.t, func(got []time.Time) bool {
		if len(got) != len(want) {
			return false
		}
		for i := range want {
			if !got[i].Equal(g.at(want[i])) {
				return false
			}
		}
		return true
	})
}

// advanceTo moves the clock to d after the start.
func (g *keeperRig) advanceTo(d time.Duration) { g.clock.Advance(g.at(d).Sub(g.clock.Now())) }

func (g *keeperRig) nextCall() renewCall {
	g.t.Helper()
	select {
	case c := <-g.r.calls:
		if c.token != 7 || c.ttl != 30*time.Second {
			g.t.Fatalf("renewal with token %d ttl %v", c.token, c.ttl)
		}
		return c
	case <-g.done:
		g.t.Fatalf("keeper returned %v, want a renewal", g.err)
	case <-time.After(30 * time.Second):
		g.t.Fatal("no renewal")
	}
	return renewCall{}
}

func (g *keeperRig) result() error {
	g.t.Helper()
	select {
	case <-g.done:
		return g.err
	case c := <-g.r.calls:
		g.t.Fatalf("renewal of token %d, want the keeper to return", c.token)
	case <-time.After(30 * time.Second):
		g.t.Fatal("keeper did not return")
	}
	return nil
}

func TestKeeperRenewsEveryThirdOfTheTTL(t *testing.T) {
	g := newKeeperRig(t)
	g.parkedUntil(10 * time.Second)
	g.advanceTo(10 * time.Second)
	c := g.nextCall()
	// While the renewal is out, the keeper watches the deadline of the
	// acquisition: sent at 0, 30 s TTL, 3 s margin.
	g.parkedUntil(27 * time.Second)
	g.advanceTo(12 * time.Second) // the answer takes 2 s
	c.answer <- nil
	// The next renewal is due a third of the TTL after this one was sent
	// (10 s), not after its answer came.
	g.parkedUntil(20 * time.Second)
	g.advanceTo(20 * time.Second)
	c = g.nextCall()
	g.parkedUntil(37 * time.Second) // deadline: sent at 10 s + 30 s - 3 s
	c.answer <- nil
	g.parkedUntil(30 * time.Second)
	g.cancel()
	if err := g.result(); err != nil {
		t.Fatalf("keep after cancel = %v, want nil", err)
	}
}

func TestKeeperLosesOnRefusal(t *testing.T) {
	g := newKeeperRig(t)
	g.advanceTo(10 * time.Second)
	refusal := &leaseapi.ProblemError{Status: 409, Code: "lease-lost"}
	g.nextCall().answer <- refusal
	err := g.result()
	if !errors.Is(err, errLeaseLost) || !errors.Is(err, fencing.ErrLeaseLost) {
		t.Fatalf("keep = %v, want lease lost by refusal", err)
	}
}

func TestKeeperRetriesTransientFailuresUntilTheDeadline(t *testing.T) {
	for _, fault := range []error{
		fmt.Errorf("dial: %w", fencing.ErrUnavailable),
		fmt.Errorf("reset: %w", fencing.ErrAmbiguous),
		&leaseapi.ProblemError{Status: 503, Code: "store-unavailable"},
	} {
		t.Run(fault.Error(), func(t *testing.T) {
			g := newKeeperRig(t)
			g.advanceTo(10 * time.Second)
			g.nextCall().answer <- fault
			// Retried every TTL/10 ...
			for at := 13 * time.Second; at < 27*time.Second; at += 3 * time.Second {
				g.parkedUntil(at)
				g.advanceTo(at)
				g.nextCall().answer <- fault
			}
			// ... the retry due at 28 s is past the deadline (27 s): the
			// keeper wakes at the deadline and gives up.
			g.parkedUntil(27 * time.Second)
			g.advanceTo(27 * time.Second)
			err := g.result()
			if !errors.Is(err, errLeaseLost) || !errors.Is(err, errDeadline) || !errors.Is(err, fault) {
				t.Fatalf("keep = %v, want lost at the deadline, naming the last failure", err)
			}
		})
	}
}

func TestKeeperRecoversAfterATransientFailure(t *testing.T) {
	g := newKeeperRig(t)
	g.advanceTo(10 * time.Second)
	g.nextCall().answer <- fencing.ErrUnavailable
	g.parkedUntil(13 * time.Second)
	g.advanceTo(13 * time.Second)
	g.nextCall().answer <- nil
	// Confirmed by the request sent at 13 s: next renewal at 23 s,
	// deadline 40 s.
	g.parkedUntil(23 * time.Second)
	g.advanceTo(23 * time.Second)
	g.nextCall()
	g.parkedUntil(40 * time.Second)
}

func TestKeeperAbandonsARenewalStillOutAtTheDeadline(t *testing.T) {
	g := newKeeperRig(t)
	g.advanceTo(10 * time.Second)
	c := g.nextCall() // never answered: the server is stopped
	g.parkedUntil(27 * time.Second)
	g.advanceTo(27*time.Second - time.Millisecond)
	g.parkedUntil(27 * time.Second) // still waiting, one millisecond before
	g.advanceTo(27 * time.Second)
	err := g.result()
	if !errors.Is(err, errLeaseLost) || !errors.Is(err, errDeadline) {
		t.Fatalf("keep = %v, want lost at the deadline", err)
	}
	if c.ctx.Err() == nil {
		t.Fatal("the abandoned renewal's request was not cancelled")
	}
}

func TestKeeperDeadlineCountsFromTheSendingOfTheRequest(t *testing.T) {
	// An acquisition sent long ago (a slow answer) leaves less time: the
	// keeper renews at once and its deadline is still the old one.
	clk := newFakeClock()
	r := &scriptedRenewer{calls: make(chan renewCall)}
	k := &leaseKeeper{client: r, clock: clk, resource: "job:1", owner: "w", token: 7, ttl: 30 * time.Second}
	sent := clk.Now()
	clk.Advance(20 * time.Second)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- k.keep(ctx, sent) }()
	<-r.calls // due at 10 s: renewed at once
	want := sent.Add(27 * time.Second)
	clk.waitWakes(t, func(got []time.Time) bool { return len(got) == 1 && got[0].Equal(want) })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("keep after cancel = %v", err)
	}
}
