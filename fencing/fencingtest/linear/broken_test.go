package linear_test

import (
	"context"
	"flag"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"pgregory.net/rapid"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/fencingtest/linear"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/failrecorder"
)

// twoStepAdmit is a deliberately broken store: its admission reads the
// high-water mark in one step and writes it in another, as a gate that
// GETs the mark and decides in Go would. Two concurrent admissions can both
// pass, and the lower one can then lower the mark.
type twoStepAdmit struct {
	*memstore.Store
	mu sync.Mutex
	hw map[string]fencing.Token
}

func (s *twoStepAdmit) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	st, err := s.Store.Status(ctx, req.Resource) // step 1: read
	if err != nil {
		return fencing.Admission{}, err
	}
	s.mu.Lock()
	hw := s.hw[req.Resource]
	s.mu.Unlock()
	switch {
	case req.Token > st.Issued:
		return fencing.Admission{}, &fencing.TokenNotIssuedError{Resource: req.Resource, Token: req.Token, Issued: st.Issued}
	case req.Token < hw:
		return fencing.Admission{}, &fencing.StaleTokenError{Resource: req.Resource, Token: req.Token, HighWater: hw}
	case req.RequireLive && (st.Lease == nil || st.Lease.Token != req.Token):
		return fencing.Admission{}, fencing.ErrLeaseNotHeld
	}
	runtime.Gosched()
	s.mu.Lock() // step 2: write
	s.hw[req.Resource] = req.Token
	s.mu.Unlock()
	return fencing.Admission{Resource: req.Resource, Token: req.Token, HighWater: req.Token, Issued: st.Issued, Raised: req.Token > hw}, nil
}

func (s *twoStepAdmit) Status(ctx context.Context, resource string) (fencing.Status, error) {
	st, err := s.Store.Status(ctx, resource)
	s.mu.Lock()
	st.HighWater = s.hw[resource]
	s.mu.Unlock()
	return st, err
}

// expiryBlind is a deliberately broken store: its Acquire ignores expiry,
// so a lease that expired still blocks other owners (held by its old
// holder). Every call is atomic (one lock), so only the expiry bug shows.
type expiryBlind struct {
	*memstore.Store
	mu sync.Mutex
}

func (s *expiryBlind) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.Store.Status(ctx, req.Resource)
	if err != nil {
		return fencing.Lease{}, err
	}
	if p := st.Previous; st.Lease == nil && p != nil && p.Ended == fencing.EndExpired && p.Token == st.Issued && p.Owner != req.Owner {
		return fencing.Lease{}, &fencing.LeaseHeldError{Resource: req.Resource, Holder: p.Owner}
	}
	return s.Store.Acquire(ctx, req)
}

// Every other call takes the same lock, so Acquire's two steps are atomic.
func (s *expiryBlind) Status(ctx context.Context, r string) (fencing.Status, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Store.Status(ctx, r)
}

func (s *expiryBlind) Renew(ctx context.Context, req fencing.RenewRequest) (fencing.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Store.Renew(ctx, req)
}

func (s *expiryBlind) Release(ctx context.Context, req fencing.ReleaseRequest) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Store.Release(ctx, req)
}

// caught runs the broken store through up to tries short runs and reports
// whether the checker found a history that is not linearizable.
func caught(t *testing.T, tries int, open func(clock *fencingtest.FakeClock) fencing.Store, opts linear.Options) bool {
	t.Helper()
	for i := range tries {
		clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
		st := open(clock)
		opts.Now, opts.Advance = clock.Now, clock.Advance
		opts.Seed = uint64(i + 1)
		h, _ := linear.Record(st, opts)
		st.Close()
		dir := t.TempDir() // expected failures: keep nothing
		v := linear.CheckHistory(h.Operations(), false, time.Minute, dir, opts.Name)
		if v.Result == porcupine.Illegal {
			if v.Counterexample == "" {
				t.Errorf("illegal history without a counterexample")
			}
			for _, f := range []string{v.Artifact, v.HistoryFile} {
				if _, err := os.Stat(f); f == "" || err != nil {
					t.Errorf("artifact %q not written: %v", f, err)
				}
			}
			t.Logf("%s caught on run %d of %d (%d calls):\n%s\nHTML: %s", opts.Name, i+1, tries, h.Len(), v.Counterexample, v.Artifact)
			return true
		}
	}
	return false
}

func TestCatchesTwoStepAdmission(t *testing.T) {
	open := func(clock *fencingtest.FakeClock) fencing.Store {
		return &twoStepAdmit{Store: memstore.New(memstore.Options{Clock: clock}), hw: map[string]fencing.Token{}}
	}
	// Mostly admissions on one resource, many clients.
	opts := linear.Options{Name: "broken-two-step-admit", Clients: 8, Resources: 1, Ops: 1500, Weights: admitHeavy}
	if !caught(t, 20, open, opts) {
		t.Fatal("the checker did not catch an admission that reads and writes the high-water mark in two steps")
	}
}

func TestCatchesAcquireIgnoringExpiry(t *testing.T) {
	open := func(clock *fencingtest.FakeClock) fencing.Store {
		return &expiryBlind{Store: memstore.New(memstore.Options{Clock: clock})}
	}
	// Acquisitions by several owners on one resource, time moving fast.
	opts := linear.Options{Name: "broken-expiry-blind-acquire", Clients: 4, Resources: 1, Ops: 800, Weights: acquireHeavy, Step: time.Second}
	if !caught(t, 20, open, opts) {
		t.Fatal("the checker did not catch an acquire that ignores expiry")
	}
}

// admitHeavy and acquireHeavy are the workloads of the two tests above.
var (
	admitHeavy   = [7]int{linear.Acquire: 10, linear.Release: 5, linear.Status: 10, linear.Admit: 60}
	acquireHeavy = [7]int{linear.Acquire: 50, linear.Renew: 10, linear.Release: 5, linear.Status: 20, linear.Admit: 15}
)

// TestCorrectStorePasses is the control for the two above: the same
// workloads on the memory store itself are linearizable.
func TestCorrectStorePasses(t *testing.T) {
	open := func(clock *fencingtest.FakeClock) fencing.Store { return memstore.New(memstore.Options{Clock: clock}) }
	for _, opts := range []linear.Options{
		{Name: "memory-admit-heavy", Clients: 8, Resources: 1, Ops: 1500, Weights: admitHeavy},
		{Name: "memory-acquire-heavy", Clients: 4, Resources: 1, Ops: 800, Weights: acquireHeavy, Step: time.Second},
	} {
		if caught(t, 3, open, opts) {
			t.Fatalf("%s: the memory store's history was reported not linearizable", opts.Name)
		}
	}
}

// TestPendingAndUnavailable: an acquire whose answer was lost may
// have issued a token that a later status shows; and an unavailable call is
// held to "not performed".
func TestPendingAndUnavailable(t *testing.T) {
	m := linear.Model(false)
	acq := linear.Input{Kind: linear.Acquire, Resource: "r", Owner: "a", TTL: 1000, Call: 0}
	st := linear.Input{Kind: linear.Status, Resource: "r", Call: 10}
	seen := linear.Output{Result: linear.OK, Issued: 1, HasLease: true, Return: 10,
		Lease: linear.LeaseView{Owner: "a", Token: 1, TTL: 1000, Acquired: 5, Expires: 1005}}
	hist := func(acqOut linear.Output) []porcupine.Operation {
		return []porcupine.Operation{
			{ClientId: 0, Input: acq, Call: 0, Output: acqOut, Return: 100},
			{ClientId: 1, Input: st, Call: 10, Output: seen, Return: 20},
		}
	}
	if !porcupine.CheckOperations(m, hist(linear.Output{Result: linear.Ambiguous})) {
		t.Error("an ambiguous acquire that took effect was judged impossible")
	}
	if porcupine.CheckOperations(m, hist(linear.Output{Result: linear.Unavailable})) {
		t.Error("an unavailable acquire that took effect was accepted")
	}
	if porcupine.CheckOperations(m, hist(linear.Output{Result: linear.Refused, Refusal: linear.LeaseHeld, Holder: "b"})) {
		t.Error("a refused acquire that took effect was accepted")
	}
}

// TestStateMachineCatchesAcquireIgnoringExpiry: the rapid state machine
// finds the expiry-blind store's bug and shrinks it to a short sequence.
func TestStateMachineCatchesAcquireIgnoringExpiry(t *testing.T) {
	// A deliberate failure must not leave rapid fail files in the source
	// tree.
	if err := flag.Set("rapid.nofailfile", "true"); err != nil {
		t.Fatal(err)
	}
	rec := failrecorder.New(t)
	rapid.Check(rec, linear.StateMachine(func(_ *rapid.T, clock *fencingtest.FakeClock) fencing.Store {
		return &expiryBlind{Store: memstore.New(memstore.Options{Clock: clock})}
	}))
	if !rec.Failed() {
		t.Fatal("the state machine did not catch an acquire that ignores expiry")
	}
	if !strings.Contains(rec.Report(), "the model does not accept") {
		t.Fatalf("the failure is not the model's refusal:\n%s", rec.Report())
	}
	t.Logf("caught, shrunk:\n%s", rec.Report())
}
