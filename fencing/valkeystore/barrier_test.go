package valkeystore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestSharedBarrier runs the shared barrier's conformance suite against one
// server and a 3-node cluster.
func TestSharedBarrier(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := valkeytest.Start(t)
		fencingtest.RunSharedBarrier(t, barrierHarness(srv.URL(), srv.Do))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := valkeytest.StartCluster(t, 3)
		fencingtest.RunSharedBarrier(t, barrierHarness(cl.URL(), cl.Nodes[0].Do))
	})
}

// barrierHarness opens gates over one fresh key prefix on the server at
// url; do runs a command on one of its nodes (for the server's TIME).
func barrierHarness(url string, do func(...string) (string, error)) fencingtest.BarrierHarness {
	return fencingtest.BarrierHarness{
		Open: func(t testing.TB, n int) fencingtest.BarrierInstance {
			prefix := freshPrefix()
			var gates []fencing.Store
			for range n {
				gates = append(gates, open(t, url, prefix))
			}
			view := open(t, url, prefix)
			return fencingtest.BarrierInstance{
				Gates: gates,
				Entries: func(t testing.TB, res string) int {
					t.Helper()
					n, err := view.client.Do(context.Background(), view.client.B().Zcard().Key(view.barKey(res)).Build()).AsInt64()
					if err != nil {
						t.Fatal(err)
					}
					return int(n)
				},
				Deadline: func(t testing.TB, e fencing.BarrierEntry) time.Time {
					t.Helper()
					ms, err := strconv.ParseInt(e.ID[:max(strings.IndexByte(e.ID, '|'), 0)], 10, 64)
					if err != nil {
						t.Fatalf("entry id %q: %v", e.ID, err)
					}
					return time.UnixMilli(ms)
				},
				Now: func(t testing.TB) time.Time { return time.UnixMilli(serverMillis(t, do)) },
			}
		},
		NotifyOnly: func() func() {
			recheck := barrierRecheck
			barrierRecheck = time.Hour
			return func() { barrierRecheck = recheck }
		},
		DropsExpired: true, // the entries' key expires at the latest deadline
	}
}

// serverMillis is the server's TIME in milliseconds.
func serverMillis(t testing.TB, do func(...string) (string, error)) int64 {
	t.Helper()
	out, err := do("TIME")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("TIME: %q", out)
	}
	sec, _ := strconv.ParseInt(f[0], 10, 64)
	usec, _ := strconv.ParseInt(f[1], 10, 64)
	return sec*1000 + usec/1000
}

// TestWaitLowerFailsClosedWhenTheServerLosesTheBarrier: a write waiting
// behind a lower one whose entries the server then loses (FLUSHALL here, as
// a restart without persistence or a failover to a replica that missed
// them would) is refused, not let through as if the lower write had ended:
// it would otherwise reach the upstream while the lower one is still in
// flight, and before a higher one waiting beside it.
func TestWaitLowerFailsClosedWhenTheServerLosesTheBarrier(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	g1, g2 := open(t, srv.URL(), prefix), open(t, srv.URL(), prefix)
	ctx := context.Background()
	a, err := g1.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := g1.AdmitRegister(ctx, fencing.AdmitRequest{Resource: "job:1", Token: a.Token}, "g1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := g1.Release(ctx, fencing.ReleaseRequest{Resource: "job:1", Owner: "a", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	b, err := g2.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, entry, behind, err := g2.AdmitRegister(ctx, fencing.AdmitRequest{Resource: "job:1", Token: b.Token}, "g2", time.Minute)
	if err != nil || !behind {
		t.Fatalf("b's write admitted behind a's: %v, behind %v", err, behind)
	}
	waited := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := g2.WaitLower(wctx, entry)
		waited <- err
	}()
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("b's write after the server lost the barrier: %v, want a refusal (ErrUnavailable)", err)
	}
}

// TestEntriesOfGatesWithOneIDStayApart: gates given one FENCEGATE_GATE_ID
// (a setting shared by every replica) each number their entries from one.
// Two of their writes registered in the same millisecond, here with one
// token, must still be two entries: as one member, the second would
// replace the first, and the first gate's removal would take the entry of
// a write still in flight through the second, letting a higher token
// through ahead of it. Each round starts the numbering again, as two
// processes started together would.
func TestEntriesOfGatesWithOneIDStayApart(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	g1, g2 := open(t, srv.URL(), prefix), open(t, srv.URL(), prefix)
	ctx := context.Background()
	l, err := g1.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	req := fencing.AdmitRequest{Resource: "job:1", Token: l.Token}
	for i := range 100 {
		entrySeq.Store(0)
		_, e1, _, err := g1.AdmitRegister(ctx, req, "gate", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		entrySeq.Store(0)
		_, e2, _, err := g2.AdmitRegister(ctx, req, "gate", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if n := srv.MustDo("ZCARD", prefix+":{job:1}:bar"); e1.ID == e2.ID || n != "2" {
			t.Fatalf("round %d: two writes in flight through two gates named alike are entries %q and %q, %s in the store; want two", i, e1.ID, e2.ID, n)
		}
		if err := g1.Leave(ctx, e1); err != nil {
			t.Fatal(err)
		}
		if err := g2.Leave(ctx, e2); err != nil {
			t.Fatal(err)
		}
	}
}
