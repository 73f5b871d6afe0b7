//go:build linux

package proxy

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestLoopBatchesAdmissions: while a loop's batch is with the store, the
// writes that arrive wait for the next one, and go together; each is
// answered as it would be alone (admitted, stale, not issued), and the
// upstream receives exactly the admitted ones, in token order per
// resource.
func TestLoopBatchesAdmissions(t *testing.T) {
	clock := newFakeClock()
	st := &batchedStore{Store: memstore.New(memstore.Options{Clock: clock}), hold: make(chan struct{})}
	e := newEnvStore(t, testRules, st, clock)
	if e.gate.batch == nil {
		t.Fatal("the gate does not batch admissions for a store with AdmitBatch")
	}
	loops := loopCount(0, runtime.GOMAXPROCS(0))
	const resources, perResource = 4, 10
	type write struct {
		res    string
		tok    fencing.Token
		status int
	}
	var writes []write
	for r := range resources {
		res := fmt.Sprintf("job:%d", r)
		old := e.acquire(res, "a", time.Hour)
		if _, err := st.Release(context.Background(), fencing.ReleaseRequest{Resource: res, Owner: "a", Token: old.Token}); err != nil {
			t.Fatal(err)
		}
		cur := e.acquire(res, "b", time.Hour)
		if _, err := st.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: cur.Token}); err != nil {
			t.Fatal(err)
		}
		for i := range perResource {
			switch i % 5 {
			case 0:
				writes = append(writes, write{res, old.Token, http.StatusConflict}) // stale
			case 1:
				writes = append(writes, write{res, cur.Token + 1, http.StatusConflict}) // not issued
			default:
				writes = append(writes, write{res, cur.Token, http.StatusOK})
			}
		}
	}
	got := make([]response, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Go(func() {
			got[i] = e.do("PUT", "/jobs/"+w.res[len("job:"):], fmt.Sprintf("w%d", i), HeaderToken, tok(w.tok))
		})
	}
	// Every write is in the gate (the first of each loop's batch with the
	// store, held; the others queued behind it) before the store answers.
	waitFor(t, "every write to reach the gate", func() bool { return len(e.gate.inFlight.list()) == len(writes) })
	close(st.hold)
	wg.Wait()
	for i, w := range writes {
		if got[i].Status != w.status {
			t.Fatalf("write %d (%s, token %d): %d %s, want %d", i, w.res, w.tok, got[i].Status, got[i].Body, w.status)
		}
		if got[i].Status == http.StatusOK && got[i].Body != fmt.Sprintf("applied w%d", i) {
			t.Fatalf("write %d answered %q", i, got[i].Body)
		}
	}
	wantUp := 0
	for _, w := range writes {
		if w.status == http.StatusOK {
			wantUp++
		}
	}
	recs := e.up.requests()
	if len(recs) != wantUp {
		t.Fatalf("the upstream received %d writes, want the %d admitted", len(recs), wantUp)
	}
	for _, rec := range recs {
		var n int
		if _, err := fmt.Sscanf(rec.Body, "w%d", &n); err != nil || writes[n].status != http.StatusOK || rec.Token != tok(writes[n].tok) {
			t.Fatalf("the upstream received %+v, which the gate did not admit", rec)
		}
	}
	b, n := st.batches.Load(), st.items.Load()
	if n != int64(len(writes)) || b > int64(2*loops) {
		t.Fatalf("%d writes went to the store in %d batches (%d loops); want all %d in at most %d", n, b, loops, len(writes), 2*loops)
	}
}
