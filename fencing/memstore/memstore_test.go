package memstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/fencingtest/linear"
	"github.com/fencegate/fencegate/fencing/memstore"
	"pgregory.net/rapid"
)

// testMaxCheckpointBytes is small so the oversize cases stay cheap.
const testMaxCheckpointBytes = 4 << 10

// testRetention is the retention of the suite's stores, on the fake clock.
const testRetention = time.Hour

func harness(maxState int, clockTokens bool) fencingtest.Harness {
	return fencingtest.Harness{
		MaxCheckpointBytes: maxState,
		Open: func(t testing.TB) fencingtest.Instance {
			clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
			// The background sweep stays out of the way (a day between
			// passes): the cases sweep when they mean to.
			st := memstore.New(memstore.Options{Clock: clock, MaxCheckpointBytes: maxState, ClockTokens: clockTokens,
				Retention: testRetention, SweepInterval: 24 * time.Hour})
			t.Cleanup(func() { st.Close() })
			// Reopen is nil: the memory store keeps nothing across a restart.
			return fencingtest.Instance{Store: st, Advance: clock.Advance, Rewind: clock.Rewind,
				ClockTokens: clockTokens, Retention: testRetention, Sweep: st.Sweep,
				Delete: func(t testing.TB, res string) { memstore.DeleteRecord(st, res) }}
		},
	}
}

// TestConformance runs the suite on tokens counted from one (the zero
// Options, which tests elsewhere rely on) and on tokens on the clock (what
// FENCEGATE_STORE=memory: uses).
func TestConformance(t *testing.T) {
	t.Run("CountFromOne", func(t *testing.T) { fencingtest.Run(t, harness(testMaxCheckpointBytes, false)) })
	t.Run("ClockTokens", func(t *testing.T) { fencingtest.Run(t, harness(testMaxCheckpointBytes, true)) })
}

// TestConformanceDefaultLimit runs the suite at the default 1 MiB state
// limit, the one production uses.
func TestConformanceDefaultLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	fencingtest.Run(t, harness(0, true))
}

// TestConformanceRealClock runs the suite on the host's clock, the way
// stores without an injectable clock run it.
func TestConformanceRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("short: sleeps past 1 s leases")
	}
	fencingtest.Run(t, fencingtest.Harness{
		MaxCheckpointBytes: testMaxCheckpointBytes,
		Open: func(t testing.TB) fencingtest.Instance {
			st := memstore.New(memstore.Options{MaxCheckpointBytes: testMaxCheckpointBytes, ClockTokens: true,
				Retention: time.Second, SweepInterval: time.Hour})
			t.Cleanup(func() { st.Close() })
			return fencingtest.Instance{Store: st, ClockTokens: true, Retention: time.Second, Sweep: st.Sweep}
		},
	})
}

func BenchmarkStore(b *testing.B) {
	fencingtest.RunBenchmarks(b, fencingtest.Harness{
		Open: func(t testing.TB) fencingtest.Instance {
			st := memstore.New(memstore.Options{Clock: fencing.SystemClock{}})
			t.Cleanup(func() { st.Close() })
			return fencingtest.Instance{Store: st}
		},
	})
}

// TestLinearizable checks a concurrent history of random calls against the
// model of one resource, with the fake clock moving under the clients so
// leases expire during the run.
func TestLinearizable(t *testing.T) {
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	st := memstore.New(memstore.Options{Clock: clock})
	defer st.Close()
	linear.Check(t, st, linear.Options{Name: "memory", Now: clock.Now, Advance: clock.Advance, Ops: linear.SoakOr(3000, 1000000)})
}

// TestStateMachine checks random call sequences against the model of one
// resource, answer by answer, with rapid shrinking any failure.
func TestStateMachine(t *testing.T) {
	linear.CheckStateMachine(t, func(_ *rapid.T, clock *fencingtest.FakeClock) fencing.Store {
		return memstore.New(memstore.Options{Clock: clock})
	})
}

// TestAdmitAtTheMarkAllocatesNothing: the gate's common admission costs no
// heap allocation.
func TestAdmitAtTheMarkAllocatesNothing(t *testing.T) {
	st := memstore.New(memstore.Options{})
	defer st.Close()
	fencingtest.CheckAdmitAtTheMarkAllocs(t, st)
}

// TestQuickAdmit: the memory store answers every admission Admit would
// grant at once, raises included (the gate's event loops rely on it).
func TestQuickAdmit(t *testing.T) {
	fencingtest.CheckQuickAdmit(t, memstore.New(memstore.Options{}), true)
}

// TestListWhileWriting pages through the live leases under a prefix while
// other goroutines acquire and release leases under it and beside it
// (under -race: List reads the store only under its lock). The leases held
// throughout are listed exactly once each, in order, on pages of at most
// the limit, and nothing listed is outside the prefix.
func TestListWhileWriting(t *testing.T) {
	st := memstore.New(memstore.Options{})
	defer st.Close()
	ctx := context.Background()
	held := map[string]bool{}
	for i := range 50 {
		res := fmt.Sprintf("job:held:%03d", i)
		if _, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "keeper", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		held[res] = true
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				for _, res := range []string{fmt.Sprintf("job:churn:%d:%d", w, i%40), fmt.Sprintf("other:%d:%d", w, i%40)} {
					l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "churner", TTL: time.Hour})
					if err != nil {
						t.Error(err)
						return
					}
					if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "churner", Token: l.Token}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	for range 200 {
		seen := map[string]bool{}
		after := ""
		for {
			page, err := st.List(ctx, fencing.ListRequest{Prefix: "job:", Limit: 7, After: after})
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > 7 {
				t.Fatalf("page of %d leases, limit 7", len(page))
			}
			for _, l := range page {
				if !strings.HasPrefix(l.Resource, "job:") || l.Resource <= after || seen[l.Resource] {
					t.Fatalf("listed %q after %q (seen before: %v)", l.Resource, after, seen[l.Resource])
				}
				seen[l.Resource] = true
				after = l.Resource
			}
			if len(page) < 7 {
				break
			}
		}
		for res := range held {
			if !seen[res] {
				t.Fatalf("held lease %s not listed", res)
			}
		}
	}
	close(stop)
	wg.Wait()
}
