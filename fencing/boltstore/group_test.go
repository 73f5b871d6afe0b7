package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
)

// groupRig holds the first group's commit until the test lets it go, so
// that the calls started meanwhile queue and form the next group together.
type groupRig struct {
	st      *boltstore.Store
	release chan struct{}
	held    chan struct{}
	mu      sync.Mutex
	sizes   []int // calls per committed group, in commit order
	once    sync.Once
}

func newGroupRig(t *testing.T, failOn string) *groupRig {
	return newGroupRigWith(t, failOn, "")
}

// newGroupRigWith is newGroupRig whose writes of panicOn panic after they
// saved their record.
func newGroupRigWith(t *testing.T, failOn, panicOn string) *groupRig {
	t.Helper()
	g := &groupRig{release: make(chan struct{}), held: make(chan struct{})}
	g.st = open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{CountFromOne: true})
	t.Cleanup(func() { g.st.Close() })
	afterSave := func(res string) error {
		switch res {
		case failOn:
			return errors.New("injected storage failure")
		case panicOn:
			panic("injected panic")
		}
		return nil
	}
	boltstore.SetHooks(g.st, afterSave, func(calls int) {
		g.mu.Lock()
		g.sizes = append(g.sizes, calls)
		g.mu.Unlock()
		g.once.Do(func() {
			close(g.held)
			<-g.release
		})
	})
	return g
}

// hold starts a first write (on "first") whose commit blocks until let is
// called, and waits until it does block.
func (g *groupRig) hold(t *testing.T) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := g.st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "first", Owner: "o", TTL: time.Hour})
		done <- err
	}()
	<-g.held
	return done
}

// waitQueued waits until n calls are queued behind the held group. It
// polls without a deadline of its own: the test's timeout bounds it.
func (g *groupRig) waitQueued(n int) {
	for boltstore.Queued(g.st) < n {
		time.Sleep(time.Millisecond)
	}
}

func (g *groupRig) groupSizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.sizes...)
}

// TestGroupCommitOneTransactionManyAnswers: writes that arrive while a
// commit runs share the next transaction; each gets its own answer (new
// leases, a refusal, a same-resource conflict decided in queue order), and
// all of them are in the store afterwards, the mark cache included.
func TestGroupCommitOneTransactionManyAnswers(t *testing.T) {
	g := newGroupRig(t, "")
	ctx := context.Background()
	first := g.hold(t)

	const n = 8
	type result struct {
		lease fencing.Lease
		err   error
	}
	results := make([]result, n)
	var renewErr error
	contested := make([]result, 2)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := g.st.Acquire(ctx, fencing.AcquireRequest{Resource: fmt.Sprintf("g:%d", i), Owner: "w", TTL: time.Hour})
			results[i] = result{l, err}
		}()
	}
	wg.Add(1)
	go func() { // refused: nobody holds "g:none"
		defer wg.Done()
		_, renewErr = g.st.Renew(ctx, fencing.RenewRequest{Resource: "g:none", Owner: "w", Token: 1})
	}()
	for i := range contested {
		wg.Add(1)
		go func() { // two owners, one resource, one group: one wins
			defer wg.Done()
			l, err := g.st.Acquire(ctx, fencing.AcquireRequest{Resource: "g:contested", Owner: fmt.Sprintf("c%d", i), TTL: time.Hour})
			contested[i] = result{l, err}
		}()
	}
	g.waitQueued(n + 1 + len(contested))
	close(g.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("first Acquire: %v", err)
	}

	if got := g.groupSizes(); len(got) != 2 || got[0] != 1 || got[1] != n+1+len(contested) {
		t.Fatalf("calls per commit %v, want [1 %d]: the queued writes share one transaction", got, n+1+len(contested))
	}
	if cs := g.st.CommitStats(); cs.Groups != 2 || cs.Calls != uint64(1+n+1+len(contested)) {
		t.Fatalf("CommitStats %+v, want 2 groups carrying %d calls", cs, 1+n+1+len(contested))
	}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("Acquire g:%d: %v", i, r.err)
		}
		st, err := g.st.Status(ctx, r.lease.Resource)
		if err != nil || st.Lease == nil || st.Lease.Token != r.lease.Token {
			t.Fatalf("Status(%s) = %+v, %v; want the lease with token %d", r.lease.Resource, st, err, r.lease.Token)
		}
		// Raise the mark through Admit, then admit at it from the cache.
		if _, err := g.st.Admit(ctx, fencing.AdmitRequest{Resource: r.lease.Resource, Token: r.lease.Token}); err != nil {
			t.Fatal(err)
		}
		if _, ok := g.st.AdmitNow(fencing.AdmitRequest{Resource: r.lease.Resource, Token: r.lease.Token}); !ok {
			t.Fatalf("AdmitNow(%s) not answered from the mark cache after the raise", r.lease.Resource)
		}
	}
	if !errors.Is(renewErr, fencing.ErrLeaseLost) {
		t.Fatalf("Renew of a resource nobody holds: %v, want ErrLeaseLost", renewErr)
	}
	won := 0
	var held *fencing.LeaseHeldError
	for _, r := range contested {
		switch {
		case r.err == nil:
			won++
		case !errors.As(r.err, &held):
			t.Fatalf("contested Acquire: %v, want success or lease held", r.err)
		}
	}
	if won != 1 {
		t.Fatalf("%d owners acquired g:contested in one group, want exactly 1", won)
	}
}

// TestGroupCommitFailureSparesNeighbours: a call whose storage work fails
// inside a group gets its own error (not done: ErrUnavailable, nothing of
// it stored); the other calls of its group run again without it and
// succeed, and what they stored is whole.
func TestGroupCommitFailureSparesNeighbours(t *testing.T) {
	g := newGroupRig(t, "g:boom")
	ctx := context.Background()
	first := g.hold(t)

	const n = 6
	errs := make([]error, n)
	leases := make([]fencing.Lease, n)
	var boomErr error
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], errs[i] = g.st.Acquire(ctx, fencing.AcquireRequest{Resource: fmt.Sprintf("g:%d", i), Owner: "w", TTL: time.Hour})
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, boomErr = g.st.Acquire(ctx, fencing.AcquireRequest{Resource: "g:boom", Owner: "w", TTL: time.Hour})
	}()
	g.waitQueued(n + 1)
	close(g.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("first Acquire: %v", err)
	}

	if !errors.Is(boomErr, fencing.ErrUnavailable) || errors.Is(boomErr, fencing.ErrAmbiguous) {
		t.Fatalf("failing Acquire: %v, want ErrUnavailable (not done)", boomErr)
	}
	if st, err := g.st.Status(ctx, "g:boom"); err != nil || st.Issued != 0 || st.Lease != nil {
		t.Fatalf("Status(g:boom) = %+v, %v; want nothing stored", st, err)
	}
	if got := g.groupSizes(); len(got) != 2 || got[1] != n {
		t.Fatalf("calls per commit %v, want [1 %d]: the neighbours commit together once, without the failing call", got, n)
	}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("neighbour Acquire g:%d failed with the failing call: %v", i, errs[i])
		}
		st, err := g.st.Status(ctx, leases[i].Resource)
		if err != nil || st.Lease == nil || st.Lease.Token != leases[i].Token || st.Issued != leases[i].Token {
			t.Fatalf("Status(%s) = %+v, %v; want the lease with token %d", leases[i].Resource, st, err, leases[i].Token)
		}
	}
	// The store goes on: the resource that failed can be taken later.
	boltstore.SetHooks(g.st, nil, nil)
	if _, err := g.st.Acquire(ctx, fencing.AcquireRequest{Resource: "g:boom", Owner: "w", TTL: time.Hour}); err != nil {
		t.Fatalf("Acquire g:boom without the fault: %v", err)
	}
}

// TestGroupCommitPanicSparesNeighbours: an operation that panics inside a
// group panics in its own caller (as it would without group commit, for the
// HTTP server's recoverer), stores nothing, and its neighbours commit; the
// store keeps serving.
func TestGroupCommitPanicSparesNeighbours(t *testing.T) {
	g := newGroupRigWith(t, "", "g:panic")
	ctx := context.Background()
	first := g.hold(t)
	const n = 4
	errs := make([]error, n)
	var panicked any
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = g.st.Acquire(ctx, fencing.AcquireRequest{Resource: fmt.Sprintf("g:%d", i), Owner: "w", TTL: time.Hour})
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { panicked = recover() }()
		g.st.Acquire(ctx, fencing.AcquireRequest{Resource: "g:panic", Owner: "w", TTL: time.Hour})
	}()
	g.waitQueued(n + 1)
	close(g.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if panicked != "injected panic" {
		t.Fatalf("the panicking caller recovered %v, want the operation's panic", panicked)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("neighbour g:%d: %v", i, err)
		}
	}
	if st, err := g.st.Status(ctx, "g:panic"); err != nil || st.Issued != 0 {
		t.Fatalf("Status(g:panic) = %+v, %v; want nothing stored", st, err)
	}
	if _, err := g.st.Acquire(ctx, fencing.AcquireRequest{Resource: "g:after", Owner: "w", TTL: time.Hour}); err != nil {
		t.Fatalf("Acquire after the panic: %v", err)
	}
}

// TestGroupCommitCancelWhileQueued: a caller whose context ends while its
// write waits for a group takes it back: it gets the context's error and
// nothing is stored.
func TestGroupCommitCancelWhileQueued(t *testing.T) {
	g := newGroupRig(t, "")
	first := g.hold(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := g.st.Acquire(ctx, fencing.AcquireRequest{Resource: "g:gone", Owner: "w", TTL: time.Hour})
		done <- err
	}()
	g.waitQueued(1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v, want context.Canceled", err)
	}
	if n := boltstore.Queued(g.st); n != 0 {
		t.Fatalf("%d calls queued after the cancel, want 0", n)
	}
	close(g.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if st, err := g.st.Status(context.Background(), "g:gone"); err != nil || st.Issued != 0 {
		t.Fatalf("Status(g:gone) = %+v, %v; want nothing stored", st, err)
	}
}

// BenchmarkAcquireFresh measures acquisitions of resources never used
// before (each issues a token: one durable write) from 1 and 16
// concurrent callers, the store-level counterpart of
// scripts/bench-leases.sh. With group commit the 16 callers share flushes:
// compare the ops/s of the two.
func BenchmarkAcquireFresh(b *testing.B) {
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			st := open(b, filepath.Join(b.TempDir(), "fencegate.db"), boltstore.Options{})
			defer st.Close()
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			b.ResetTimer()
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						n := next.Add(1)
						if n > int64(b.N) {
							return
						}
						if _, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: fmt.Sprintf("bench:%d", n), Owner: "o", TTL: time.Hour}); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// TestGroupCommitCloseUnderLoad: Close while writers keep coming answers
// every write (done, or unavailable once the file is closed), hangs none,
// and leaves a file that opens without a loss and holds every write that
// was answered as done.
func TestGroupCommitCloseUnderLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegate.db")
	st := open(t, path, boltstore.Options{})
	ctx := context.Background()
	const writers = 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := map[string]fencing.Token{}
	var started sync.WaitGroup
	started.Add(writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				res := fmt.Sprintf("c:%d:%d", w, i)
				l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "w", TTL: time.Hour})
				if i == 0 {
					started.Done()
				}
				if errors.Is(err, fencing.ErrUnavailable) {
					return
				}
				if err != nil {
					t.Errorf("Acquire %s: %v", res, err)
					return
				}
				mu.Lock()
				done[res] = l.Token
				mu.Unlock()
			}
		}()
	}
	started.Wait()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	st = open(t, path, boltstore.Options{})
	defer st.Close()
	if why := st.LossDetected(); why != "" {
		t.Fatalf("reopened after Close under load: loss detected: %s", why)
	}
	for res, tok := range done {
		s, err := st.Status(ctx, res)
		if err != nil || s.Lease == nil || s.Lease.Token != tok {
			t.Fatalf("Status(%s) = %+v, %v; want the lease with token %d", res, s, err, tok)
		}
	}
	t.Logf("%d writes done before Close", len(done))
}

// TestObserveCommits: the observer sees each committed group once, with
// the calls it carried (a failed call's rolled-back attempt is not a
// commit), as CommitStats counts them; a refusal alone commits nothing;
// after ObserveCommits(nil) it sees nothing more.
func TestObserveCommits(t *testing.T) {
	g := newGroupRig(t, "g:boom")
	ctx := context.Background()
	type seen struct {
		writes int
		took   time.Duration
	}
	var (
		mu  sync.Mutex
		got []seen
	)
	g.st.ObserveCommits(func(writes int, took time.Duration) {
		mu.Lock()
		got = append(got, seen{writes, took})
		mu.Unlock()
	})
	first := g.hold(t)
	const n = 5
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := g.st.Acquire(ctx, fencing.AcquireRequest{Resource: fmt.Sprintf("o:%d", i), Owner: "w", TTL: time.Hour}); err != nil {
				t.Errorf("Acquire o:%d: %v", i, err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := g.st.Acquire(ctx, fencing.AcquireRequest{Resource: "g:boom", Owner: "w", TTL: time.Hour}); !errors.Is(err, fencing.ErrUnavailable) {
			t.Errorf("Acquire g:boom: %v, want ErrUnavailable", err)
		}
	}()
	g.waitQueued(n + 1)
	close(g.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// Refused alone: nothing to write, no commit.
	if _, err := g.st.Renew(ctx, fencing.RenewRequest{Resource: "o:none", Owner: "w", Token: 1}); !errors.Is(err, fencing.ErrLeaseLost) {
		t.Fatalf("Renew of a resource nobody holds: %v, want ErrLeaseLost", err)
	}
	mu.Lock()
	observed := append([]seen(nil), got...)
	mu.Unlock()
	if len(observed) != 2 || observed[0].writes != 1 || observed[1].writes != n {
		t.Fatalf("observed commits %+v, want 2: 1 write, then the %d that remained of the group once g:boom failed", observed, n)
	}
	for _, o := range observed {
		if o.took <= 0 {
			t.Fatalf("observed commit %+v: no duration", o)
		}
	}
	if cs := g.st.CommitStats(); cs.Groups != 2 || cs.Calls != 1+n {
		t.Fatalf("CommitStats %+v, want what the observer saw: 2 groups, %d calls", cs, 1+n)
	}
	g.st.ObserveCommits(nil)
	if _, err := g.st.Acquire(ctx, fencing.AcquireRequest{Resource: "o:after", Owner: "w", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("observer called after ObserveCommits(nil): %+v", got)
	}
}
