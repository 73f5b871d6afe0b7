package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestHoldsSurviveRestart: a gate closed while a write is in flight records
// the write's resource as held; the next gate on the same store restores
// the hold and keeps higher tokens out for the grace. A gate that never
// closed (crashed) makes the next one hold every resource.
func TestHoldsSurviveRestart(t *testing.T) {
	clock := newFakeClock()
	st := memstore.New(memstore.Options{Clock: clock})
	opts := func(o *Options) {
		o.Holds = st
		o.TimeoutGrace = time.Hour
		o.BarrierTimeout = 20 * time.Millisecond
	}
	first := newEnvStore(t, testRules, st, clock, opts)
	if r, err := first.gate.RestoreHolds(context.Background()); err != nil || !r.Recorded || r.Unclean || r.Resources != 0 {
		t.Fatalf("first start: %+v %v", r, err)
	}
	arrived, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the servers close
	first.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		close(arrived)
		<-release
		return false
	}
	a := first.acquire("job:1", "a", 10*time.Second)
	clock.Advance(11 * time.Second)
	b := first.acquire("job:1", "b", 10*time.Second)
	go func() {
		_, _ = doReq(first.client, first.gateSrv.URL, "PUT", "/jobs/1", "cut off", HeaderToken, tok(a.Token))
	}()
	<-arrived
	// The process stops: the gate is closed with the write in flight.
	if n, err := first.gate.Close(context.Background()); err != nil || n != 1 {
		t.Fatalf("Close: %d %v", n, err)
	}

	second := newEnvStore(t, testRules, st, clock, opts)
	r, err := second.gate.RestoreHolds(context.Background())
	if err != nil || r.Unclean || r.Resources != 1 {
		t.Fatalf("restart after a clean stop: %+v %v", r, err)
	}
	wantProblem(t, second.do("PUT", "/jobs/1", "newer", HeaderToken, tok(b.Token)), 503, "barrier-timeout")
	if r := second.do("PUT", "/jobs/2", "x", HeaderToken, "1"); r.Status != 409 {
		t.Fatalf("another resource: %d %s", r.Status, r.Body) // not held: the store answers
	}
	if n := second.up.count(); n != 0 {
		t.Fatalf("the upstream received %d writes during the restored hold", n)
	}

	// second never closes: as if it crashed.
	third := newEnvStore(t, testRules, st, clock, opts)
	if r, err := third.gate.RestoreHolds(context.Background()); err != nil || !r.Unclean {
		t.Fatalf("restart after an unclean stop: %+v %v", r, err)
	}
	c := third.acquire("job:3", "c", 10*time.Second)
	wantProblem(t, third.do("PUT", "/jobs/3", "any", HeaderToken, tok(c.Token)), 503, "barrier-timeout")
	// A clean stop while that hold still runs must not forget it.
	if _, err := third.gate.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	fourth := newEnvStore(t, testRules, st, clock, opts)
	if r, err := fourth.gate.RestoreHolds(context.Background()); err != nil || !r.Unclean {
		t.Fatalf("restart while the previous hold on every resource ran: %+v %v", r, err)
	}
}

// TestCloseStopsForwarding: after Close, a fenced write is refused 503
// gate-stopping and never forwarded.
func TestCloseStopsForwarding(t *testing.T) {
	e := newEnv(t, testRules)
	if _, err := e.gate.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	l := e.acquire("job:1", "a", 10*time.Second)
	wantProblem(t, e.do("PUT", "/jobs/1", "x", HeaderToken, tok(l.Token)), 503, "gate-stopping")
	if n := e.up.count(); n != 0 {
		t.Fatalf("upstream called %d times", n)
	}
}
