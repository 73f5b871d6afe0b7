package loglimit

import (
	"sync"
	"testing"
	"time"
)

// TestLimiterBudgetPerSecond: the first PerSecond events of a second pass,
// the rest are counted, and the first event of the next second carries
// the count.
func TestLimiterBudgetPerSecond(t *testing.T) {
	l := Limiter{PerSecond: 20}
	t0 := time.Unix(1_000_000, 0)
	for i := range 20 {
		if ok, n := l.Allow(t0.Add(time.Duration(i) * time.Millisecond)); !ok || n != 0 {
			t.Fatalf("event %d in the first second: ok %v, suppressed %d", i, ok, n)
		}
	}
	for i := range 5 {
		if ok, _ := l.Allow(t0.Add(500 * time.Millisecond)); ok {
			t.Fatalf("event %d beyond the budget allowed", 20+i)
		}
	}
	if ok, n := l.Allow(t0.Add(time.Second)); !ok || n != 5 {
		t.Fatalf("the next second: ok %v, suppressed %d; want allowed, 5 suppressed", ok, n)
	}
	if ok, n := l.Allow(t0.Add(time.Second)); !ok || n != 0 {
		t.Fatalf("then: ok %v, suppressed %d; want the count reset", ok, n)
	}
}

// TestLimiterZeroBudget: PerSecond 0 lets nothing through.
func TestLimiterZeroBudget(t *testing.T) {
	var l Limiter
	if ok, _ := l.Allow(time.Unix(5, 0)); ok {
		t.Fatal("an event passed a zero budget")
	}
}

// TestLimiterConcurrent: many goroutines in one second get exactly the
// budget between them, even while the second begins, and every other event
// is counted once: by an event allowed after it, in that second or the
// next.
func TestLimiterConcurrent(t *testing.T) {
	l := Limiter{PerSecond: 50}
	now := time.Unix(2_000_000, 0)
	const goroutines, each = 32, 100
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		allowed    int
		suppressed int64
	)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, dropped := 0, int64(0)
			for range each {
				if ok, d := l.Allow(now); ok {
					n++
					dropped += d
				}
			}
			mu.Lock()
			allowed += n
			suppressed += dropped
			mu.Unlock()
		}()
	}
	wg.Wait()
	if allowed != 50 {
		t.Fatalf("allowed %d events in one second, want the budget of 50", allowed)
	}
	ok, n := l.Allow(now.Add(time.Second))
	if !ok {
		t.Fatal("the next second's first event was not allowed")
	}
	if suppressed+n != goroutines*each-50 {
		t.Fatalf("%d events counted as suppressed (%d of them by the next second), want %d", suppressed+n, n, goroutines*each-50)
	}
}
