package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/barrier"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestWriteInFlightKeepsItsRecord: a write still in flight through the
// gate (registered in its barrier) keeps its record past the retention,
// however long; once it has left, the next sweep removes the record.
// Without KeepInFlight the sweep removed it one retention after the
// write's admission, and the holder's next write was refused as stale.
func TestWriteInFlightKeepsItsRecord(t *testing.T) {
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	st := memstore.New(memstore.Options{Clock: clock, ClockTokens: true, Retention: 10 * time.Second, SweepInterval: 24 * time.Hour})
	defer st.Close()
	b := barrier.New()
	st.KeepInFlight(b.InFlight)
	ctx := context.Background()
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job", Owner: "w", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tk := b.Register("job", l.Token)
	if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		clock.Advance(11 * time.Second)
		if n, err := st.Sweep(ctx); err != nil || n != 0 {
			t.Fatalf("sweep with the write in flight removed %d records (%v), want 0", n, err)
		}
	}
	tk.Leave()
	if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: l.Token}); err != nil {
		t.Fatalf("the holder's next write: %v, want it admitted on its kept record", err)
	}
	clock.Advance(12 * time.Second) // the retention and its slack
	if n, err := st.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep after the write left removed %d records (%v), want 1", n, err)
	}
}
