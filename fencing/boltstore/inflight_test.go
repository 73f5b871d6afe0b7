package boltstore_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/barrier"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/fencingtest"
)

// inFlightStore opens a store with a 10 s retention on a fake clock, its
// sweep shown the writes in flight through b, and a resource "job" whose
// lease ended and whose mark is at the returned token, touched at the
// clock's reading.
func inFlightStore(t *testing.T, b *barrier.Barrier) (*boltstore.Store, *fencingtest.FakeClock, fencing.Token) {
	t.Helper()
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	st := open(t, filepath.Join(t.TempDir(), "f.db"), boltstore.Options{Clock: clock, Retention: 10 * time.Second, SweepInterval: 24 * time.Hour})
	t.Cleanup(func() { st.Close() })
	st.KeepInFlight(b.InFlight)
	ctx := context.Background()
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job", Owner: "w", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: l.Token}); err != nil { // raises: touched now
		t.Fatal(err)
	}
	return st, clock, l.Token
}

// TestWriteInFlightKeepsItsRecord: a write admitted at the mark (which
// writes no touch: the record was touched less than the slack before,
// record.TouchSlack) and still in flight through the gate when the record has been
// untouched for the retention keeps its record, however long it stays in
// flight: the sweep removes nothing, the holder's next write is admitted,
// and once the write has left the barrier the next sweep removes the
// record. Without KeepInFlight the sweep removed the record 12 s into the
// write, and the holder's next write was refused as stale.
func TestWriteInFlightKeepsItsRecord(t *testing.T) {
	b := barrier.New()
	st, clock, token := inFlightStore(t, b)
	ctx := context.Background()
	clock.Advance(time.Second) // lease ended, now: within the slack (1.25 s) of its end, no touch to write
	tk := b.Register("job", token)
	if a, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: token}); err != nil || a.Raised {
		t.Fatalf("write at the mark: %+v, %v", a, err)
	}
	if err := tk.Wait(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	for range 3 { // in flight 12 s, then 42 s, then 72 s: 7.2 retentions
		clock.Advance(12 * time.Second)
		if n, err := st.Sweep(ctx); err != nil || n != 0 {
			t.Fatalf("sweep with the write in flight removed %d records (%v), want 0", n, err)
		}
		clock.Advance(18 * time.Second)
	}
	if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: token}); err != nil {
		t.Fatalf("the holder's next write: %v, want it admitted on its kept record", err)
	}
	tk.Leave()
	clock.Advance(12 * time.Second) // the retention and its slack after that write's touch
	if n, err := st.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep after the write left removed %d records (%v), want 1", n, err)
	}
}

// TestWriteHeldKeepsItsRecord: a write held in the barrier after an unknown
// outcome (Hold), a resource held at start-up (HoldResource) and every
// resource held after an unclean stop (HoldAll) keep their records too.
func TestWriteHeldKeepsItsRecord(t *testing.T) {
	for name, hold := range map[string]func(b *barrier.Barrier, token fencing.Token){
		"Hold":         func(b *barrier.Barrier, token fencing.Token) { b.Register("job", token).Hold(time.Hour) },
		"HoldResource": func(b *barrier.Barrier, _ fencing.Token) { b.HoldResource("job", time.Hour) },
		"HoldAll":      func(b *barrier.Barrier, _ fencing.Token) { b.HoldAll(time.Hour) },
	} {
		t.Run(name, func(t *testing.T) {
			b := barrier.New()
			st, clock, token := inFlightStore(t, b)
			hold(b, token)
			clock.Advance(time.Minute)
			if n, err := st.Sweep(context.Background()); err != nil || n != 0 {
				t.Fatalf("sweep removed %d held records (%v), want 0", n, err)
			}
			b.Close(0)
		})
	}
}

// TestWriteRegisteredDuringRemoval: a write that registers after the sweep
// asked the barrier about its resource, and is admitted before the removal
// commits, is decided after the removal (in the group commit) and refused
// as stale, not admitted from the record being removed. With the clock
// running forward the rule of the stale touch already sends such an
// admission to the group commit (an idle record's touch is stale); the
// clock stepped back here by most of the retention, so the record reads
// as freshly touched. Without the removal's set of resources
// (Store.removing) the admission then read the record as last committed,
// admitted the write, and the record went under it.
func TestWriteRegisteredDuringRemoval(t *testing.T) {
	b := barrier.New()
	st, clock, token := inFlightStore(t, b)
	ctx := context.Background()
	type answer struct {
		a   fencing.Admission
		err error
	}
	answers := make(chan answer, 1)
	armed := true
	boltstore.SetHooks(st, nil, func(int) {
		if !armed {
			return
		}
		armed = false
		// In the sweep call's group, after it asked the barrier and
		// before its commit: the clock steps back, a write registers and
		// is admitted.
		clock.Rewind(11500 * time.Millisecond)
		tk := b.Register("job", token)
		go func() {
			defer tk.Leave()
			a, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: token})
			answers <- answer{a, err}
		}()
		for boltstore.Queued(st) == 0 {
			select {
			case got := <-answers:
				answers <- got // answered before the removal committed
				return
			default:
				time.Sleep(time.Millisecond)
			}
		}
	})
	clock.Advance(13 * time.Second) // the lease's 1 s, the retention and its slack
	if n, err := st.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep removed %d records (%v), want 1", n, err)
	}
	got := <-answers
	var stale *fencing.StaleTokenError
	if !errors.As(got.err, &stale) {
		t.Fatalf("write registered during the removal: %+v, %v; want stale-token (its record is gone)", got.a, got.err)
	}
}
