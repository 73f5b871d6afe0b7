package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// admitHook is a store whose Admit runs hook around the real one: before
// (the store not yet asked) and after (the real answer in hand).
type admitHook struct {
	fencing.Store
	hook func(req fencing.AdmitRequest, admit func() (fencing.Admission, error)) (fencing.Admission, error)
}

func (s admitHook) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	return s.hook(req, func() (fencing.Admission, error) { return s.Store.Admit(ctx, req) })
}

// TestRegisteredBeforeAdmission (DESIGN §1.3): a write is registered at the
// barrier before its admission check, so a higher-token write admitted
// just after it waits for it. Were it registered after, the higher write
// could pass the barrier while the lower one sits between its admission
// and its registration, and reach the upstream first.
func TestRegisteredBeforeAdmission(t *testing.T) {
	clock := newFakeClock()
	var (
		e          *env
		low        atomic.Uint64 // set once the server runs: read by the admissions
		registered = -1          // writes with token low registered once its admission returned
		admitted   = make(chan struct{})
		release    = make(chan struct{})
	)
	e = newEnvStore(t, testRules, admitHook{
		Store: memstore.New(memstore.Options{Clock: clock}),
		hook: func(req fencing.AdmitRequest, admit func() (fencing.Admission, error)) (fencing.Admission, error) {
			a, err := admit()
			if uint64(req.Token) == low.Load() {
				registered = e.gate.registered(req.Resource, req.Token)
				close(admitted)
				<-release
			}
			return a, err
		},
	}, clock)
	a := e.acquire("job:5", "a", 10*time.Second)
	clock.Advance(11 * time.Second)
	b := e.acquire("job:5", "b", 10*time.Second)
	low.Store(uint64(a.Token))
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // before the servers close, should the test stop early

	res := make(chan string, 2)
	send := func(body string, tk fencing.Token) {
		r, err := doReq(e.client, e.gateSrv.URL, "PUT", "/jobs/5", body, HeaderToken, tok(tk))
		res <- fmt.Sprintf("%s %d %v", body, r.Status, err)
	}
	go send("one", a.Token)
	<-admitted // write one is admitted and not yet forwarded
	go send("two", b.Token)
	// Two parks at the barrier (or, were one not registered, overtakes it).
	waitFor(t, "write two to park or reach the upstream", func() bool {
		return e.gate.registered("job:5", b.Token) == 1 || e.up.count() > 0
	})
	open()
	for range 2 {
		if s := <-res; !strings.HasSuffix(s, " 200 <nil>") {
			t.Fatalf("write: %s", s)
		}
	}
	// Read after close(admitted) and the answers: no race.
	if registered != 1 {
		t.Fatalf("%d writes with token %d registered during its admission check, want 1", registered, low.Load())
	}
	var bodies []string
	for _, g := range e.up.requests() {
		bodies = append(bodies, g.Body)
	}
	if strings.Join(bodies, ",") != "one,two" {
		t.Fatalf("upstream applied %v, want one then two", bodies)
	}
}

// TestStoreFaultsFailClosed (DESIGN §1.4): whenever the store cannot give
// a definite answer (unavailable, ambiguous, its data lost, or a bare
// deadline from a store that did not classify it) the write is refused
// 503 store-unavailable with Retry-After, never forwarded, and leaves
// nothing at the barrier.
func TestStoreFaultsFailClosed(t *testing.T) {
	for _, fc := range []struct {
		err     error
		outcome string // the store-unavailable outcome member
	}{
		{fencing.ErrUnavailable, "not-done"},
		{fmt.Errorf("admit: read timeout after send: %w", fencing.ErrAmbiguous), "unknown"},
		{fencing.ErrStoreLost, "not-done"},
		{context.DeadlineExceeded, "unknown"},
	} {
		fault := fc.err
		t.Run(fault.Error(), func(t *testing.T) {
			clock := newFakeClock()
			e := newEnvStore(t, testRules, admitHook{
				Store: memstore.New(memstore.Options{Clock: clock}),
				hook: func(fencing.AdmitRequest, func() (fencing.Admission, error)) (fencing.Admission, error) {
					return fencing.Admission{}, fault
				},
			}, clock)
			l := e.acquire("job:1", "a", time.Minute)
			r := e.do("PUT", "/jobs/1", "x", HeaderToken, tok(l.Token))
			wantProblem(t, r, http.StatusServiceUnavailable, "store-unavailable")
			if r.Header.Get("Retry-After") == "" {
				t.Fatal("no Retry-After")
			}
			if r.Problem["outcome"] != fc.outcome {
				t.Fatalf("outcome %v, want %s: %s", r.Problem["outcome"], fc.outcome, r.Body)
			}
			if n := e.up.count(); n != 0 {
				t.Fatalf("upstream called %d times", n)
			}
			if n := e.gate.InFlightResources(); n != 0 {
				t.Fatalf("barrier tracks %d resources", n)
			}
		})
	}
}
