package pgstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// TestRaiseIsNotStarvedByWritesAtTheMark: while many clients keep sending
// writes at a holder's mark through two gates (32 at a time, over 32
// connections), the next holder's first write, which raises the mark,
// must get through. PostgreSQL lets a new FOR SHARE locker join a row
// that other transactions share-lock even while an UPDATE waits for it,
// so the raise's UPDATE only gets the row when no admission at the mark
// holds it; if they always overlapped it would wait until its statement
// timeout (the gate's 503). The writes at the mark hold the shared lock
// through their commit, and their sessions delay each commit's flush by
// 2 ms (commit_delay), as a slower disk would, so that they overlap more.
// The flood runs until the raise returns (its writes then find their token
// stale) or, at most, for a minute, far above the store's 5 s timeout; the
// raise must succeed while the flood still runs.
func TestRaiseIsNotStarvedByWritesAtTheMark(t *testing.T) {
	ctx := context.Background()
	schema := freshSchema()
	url := pgtest.Need(t, cluster).SocketURL("postgres") + "&commit_delay=2000&commit_siblings=1"
	gates := []*Store{openURL(t, url, schema), openURL(t, url, schema), open(t, schema)}
	const res = "starve"
	for round := 0; round < 2; round++ {
		a := newHolder(t, gates[0], res, "a")
		b := newHolder(t, gates[0], res, "b") // issued; a's writes still pass until b's first
		stop := make(chan struct{})
		var (
			wg       sync.WaitGroup
			atMark   atomic.Int64
			failures atomic.Int64
		)
		for i := range 32 {
			wg.Go(func() {
				s := gates[i%2]
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, e, _, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: a}, "old", time.Minute)
					if errors.Is(err, fencing.ErrStaleToken) {
						return // the raise went through
					}
					if err != nil {
						failures.Add(1)
						t.Errorf("a write at the mark: %v", err)
						return
					}
					atMark.Add(1)
					if err := s.Leave(ctx, e); err != nil {
						failures.Add(1)
						t.Errorf("leave: %v", err)
						return
					}
				}
			})
		}
		// The flood is under way before the raise starts.
		for atMark.Load() < 200 && failures.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		before := atMark.Load()
		type result struct {
			e     fencing.BarrierEntry
			err   error
			flood int64
		}
		done := make(chan result, 1)
		go func() {
			_, e, _, err := gates[2].AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: b}, "new", time.Minute)
			done <- result{e, err, atMark.Load() - before}
		}()
		var r result
		capped := false
		select {
		case r = <-done:
		case <-time.After(time.Minute):
			capped = true
		}
		close(stop)
		if capped {
			r = <-done
		}
		wg.Wait()
		if r.err != nil {
			t.Fatalf("round %d: the next holder's first write, during a flood of writes at the old mark (%d admitted meanwhile): %v", round, r.flood, r.err)
		}
		if capped {
			t.Fatalf("round %d: the next holder's first write only got through once the flood at the old mark stopped", round)
		}
		t.Logf("round %d: the raise got through after %d writes at the old mark", round, r.flood)
		if err := gates[2].Leave(ctx, r.e); err != nil {
			t.Fatal(err)
		}
	}
}
