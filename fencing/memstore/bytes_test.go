package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestBytesPerIdleResource measures the heap an idle resource (acquired,
// written, released) costs the memory store, and that retention gives it
// back (docs/stores.md quotes the figure from its log).
func TestBytesPerIdleResource(t *testing.T) {
	const n = 20000
	clock := &stepClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	st := memstore.New(memstore.Options{Clock: clock, ClockTokens: true, Retention: time.Hour, SweepInterval: 24 * time.Hour})
	defer st.Close()
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for i := range n {
		res := fmt.Sprintf("job:%08d", i)
		l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "worker-1", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "worker-1", Token: l.Token}); err != nil {
			t.Fatal(err)
		}
	}
	peak := heap()
	per := float64(peak-min(before, peak)) / n
	t.Logf("memory store: %.0f bytes per idle resource (%d resources, 12-byte names)", per, n)
	if per > 2048 {
		t.Fatalf("%.0f bytes per idle resource, want at most 2 KiB", per)
	}
	clock.add(2 * time.Hour)
	if removed, err := st.Sweep(ctx); err != nil || removed != n {
		t.Fatalf("Sweep = %d, %v; want %d removed", removed, err, n)
	}
	after := heap()
	t.Logf("memory store: heap %d before, %d at the peak, %d after the retention", before, peak, after)
	if after > before+uint64(n)*64 {
		t.Fatalf("heap after the retention %d, want back near %d", after, before)
	}
}

type stepClock struct {
	now time.Time
}

func (c *stepClock) Now() time.Time      { return c.now }
func (c *stepClock) add(d time.Duration) { c.now = c.now.Add(d) }
