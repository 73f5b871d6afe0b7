package leaseapi_test

import (
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// fakeClock is a leaseapi.Clock, and the store's fencing.Clock, that moves
// only when the test says so. Sessions and the store share it, so lease
// arithmetic on both sides is deterministic and no test sleeps on the real
// clock to make time pass.
type fakeClock struct {
	mu     sync.Mutex
	cond   *sync.Cond
	now    time.Time
	timers []*fakeTimer
}

var (
	_ leaseapi.Clock = (*fakeClock)(nil)
	_ fencing.Clock  = (*fakeClock)(nil)
)

func newClock() *fakeClock {
	c := &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	c.cond = sync.NewCond(&c.mu)
	return c
}

type fakeTimer struct {
	c  *fakeClock
	at time.Time
	ch chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) leaseapi.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
		return t
	}
	c.timers = append(c.timers, t)
	c.cond.Broadcast()
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, p := range t.c.timers {
		if p == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}

// Advance moves the clock by d and fires every timer that is then due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- c.now
	}
	c.timers = kept
}

// waitTimer blocks until a timer set to fire at exactly at is pending: the
// way a test knows a goroutine has reached the point where it waits. The
// real-time bound only keeps a broken test from hanging.
func (c *fakeClock) waitTimer(t *testing.T, at time.Time) {
	t.Helper()
	giveUp := time.Now().Add(20 * time.Second)
	wake := time.AfterFunc(20*time.Second, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer wake.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for _, p := range c.timers {
			if p.at.Equal(at) {
				return
			}
		}
		if time.Now().After(giveUp) {
			var pending []string
			for _, p := range c.timers {
				pending = append(pending, p.at.Sub(c.now).String())
			}
			t.Fatalf("no timer for %s (now %s); pending in: %v", at.Format(time.TimeOnly), c.now.Format(time.TimeOnly), pending)
		}
		c.cond.Wait()
	}
}
