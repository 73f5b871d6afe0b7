package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestSharedBarrierCost checks DESIGN §9's cost: an uncontended write pays
// at most one more store round trip with the shared barrier than with the
// local one (the removal). A gate reaches its store through a counting
// proxy (cutProxy.trips); it forwards costWrites sequential fenced writes,
// each with a live lease's token, once with the local barrier and once
// with the shared one, on one resource (every write after the first at
// the resource's mark) and on as many resources as writes (every write
// raises a mark). The shared barrier must make at most costWrites more
// round trips in all, plus costOneTime.
func TestSharedBarrierCost(t *testing.T) {
	t.Run("valkey", func(t *testing.T) {
		t.Parallel() // round trips are counted, not timed
		srv := valkeytest.Start(t)
		// With the local barrier, a write that raises a mark costs the
		// loop's mark read and the admission script, no second read.
		testSharedBarrierCost(t, valkeyKit(srv.URL(), []*valkeytest.Server{srv}), 2)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		testSharedBarrierCost(t, postgresKit(t), 0)
	})
}

// costWrites is how many writes TestSharedBarrierCost counts per run,
// after costWarmUp writes on resources of their own.
const (
	costWrites = 200
	costWarmUp = 100
)

// costOneTime allows for round trips that are not any write's: the
// shared barrier's removals run beside the next write's admission, so a
// store client with a connection pool (pgstore) uses a second or third
// connection now and then, which prepares a statement on its first use of
// it and is pinged when it has been idle for a second (pgxpool). Measured:
// 1 to 11 over a run of costWrites.
const costOneTime = 24

// testSharedBarrierCost runs TestSharedBarrierCost on kit's store; with
// localRaise above 0, writes that each raise a mark may also cost the local
// barrier at most localRaise round trips each (plus costOneTime).
func testSharedBarrierCost(t *testing.T, kit storeKit, localRaise int) {
	for _, resources := range []int{1, costWrites} {
		t.Run(fmt.Sprintf("resources=%d", resources), func(t *testing.T) {
			local := storeTrips(t, kit, false, resources)
			shared := storeTrips(t, kit, true, resources)
			t.Logf("store round trips per write: local %.2f, shared %.2f", float64(local)/costWrites, float64(shared)/costWrites)
			if local <= 0 {
				t.Fatalf("%d round trips counted for %d local writes: the proxy does not see the store's traffic", local, costWrites)
			}
			if localRaise > 0 && resources == costWrites && local > int64(localRaise*costWrites+costOneTime) {
				t.Errorf("local barrier: %d store round trips for %d writes that each raise a mark, want at most %d each",
					local, costWrites, localRaise)
			}
			if shared > local+costWrites+costOneTime {
				t.Errorf("shared barrier: %d store round trips for %d uncontended writes, local barrier %d: more than one more per write (and %d)",
					shared, costWrites, local, costOneTime)
			}
		})
	}
}

// storeTrips is how many store round trips a gate makes for costWrites
// sequential uncontended writes spread over resources, each with a live
// lease's token, with the shared barrier or the local one. The store's own
// background traffic (health checks), counted while idle after the writes
// and scaled to their duration, is subtracted.
func storeTrips(t *testing.T, kit storeKit, shared bool, resources int) int64 {
	t.Helper()
	ns := fmt.Sprintf("cost%d", time.Now().UnixNano())
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	counter := newCutProxy(t, kit.addr)
	st := kit.via(t, ns, counter.addr(), time.Second)
	opts := Options{Upstream: u, Store: st, ResourceHeader: true}
	const gateID = "gate-cost"
	if shared {
		opts.SharedBarrier, opts.GateID = st, gateID
	}
	g, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s := serveGate(t, g)
	client := s.Client()
	t.Cleanup(client.CloseIdleConnections)

	leases := kit.open(t, ns) // directly: not counted
	tokens := map[string]fencing.Token{}
	resource := func(group string, i int) string {
		r := fmt.Sprintf("%s:%d", group, i%resources)
		if _, ok := tokens[r]; !ok {
			l, err := leases.Acquire(context.Background(), fencing.AcquireRequest{Resource: r, Owner: "w", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			tokens[r] = l.Token
		}
		return r
	}
	// write sends writes i in [from, to) of group, each once its previous
	// one was answered, and waits for the shared barrier's removals.
	write := func(group string, from, to int) {
		t.Helper()
		var used []string
		for i := from; i < to; i++ {
			r := resource(group, i)
			used = append(used, r)
			a, err := doReq(client, s.URL, "PUT", "/"+r, "x", HeaderResource, r, HeaderToken, tokens[r].String())
			if err != nil || a.Status != http.StatusNoContent {
				t.Fatalf("write %d on %s: %v %d %v", i, r, err, a.Status, a.Problem)
			}
		}
		if shared {
			for _, r := range used {
				waitFor(t, "the removal of "+r+"'s entry", func() bool { return kit.gateEntries(t, ns, r, gateID) == 0 })
			}
		}
		quiet(counter)
	}
	// Warm up: connections dialed, statements and scripts loaded, on
	// resources of their own.
	write("warm", 0, costWarmUp)
	before, start := counter.trips.Load(), time.Now()
	write("doc", 0, costWrites)
	took := time.Since(start)
	trips := counter.trips.Load() - before
	// The background's rate, over up to half a second of idling, counted
	// for as long as the writes took.
	window := min(took, 500*time.Millisecond)
	idleFrom := counter.trips.Load()
	time.Sleep(window)
	idle := (counter.trips.Load() - idleFrom) * int64(took) / int64(window)
	t.Logf("shared=%v resources=%d: %d round trips for %d writes in %v, %d while idle as long",
		shared, resources, trips, costWrites, took.Round(time.Millisecond), idle)
	return trips - idle
}

// quiet waits until no round trip went through p for 100 ms: the last
// answers have been relayed.
func quiet(p *cutProxy) {
	for last := p.trips.Load(); ; {
		time.Sleep(100 * time.Millisecond)
		n := p.trips.Load()
		if n == last {
			return
		}
		last = n
	}
}
