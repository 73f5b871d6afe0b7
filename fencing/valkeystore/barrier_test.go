package valkeystore

import (
	"context"
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
