package leaseapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// countingStore is a real store that counts the acquisitions it is asked
// for and, when holdWon is set, keeps a granted acquisition's answer until
// the caller's context ends (a client that hangs up while the store gives
// it the lease), telling won first.
type countingStore struct {
	fencing.Store
	acquires atomic.Int64
	holdWon  atomic.Bool
	won      chan struct{}
}

func (s *countingStore) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	s.acquires.Add(1)
	l, err := s.Store.Acquire(ctx, req)
	if err == nil && s.holdWon.Load() {
		s.won <- struct{}{}
		<-ctx.Done()
	}
	return l, err
}

// waitFor polls cond until it holds, failing the test after a generous
// bound (a failure bound, not a timing claim).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestWaitersQueueInArrivalOrder: acquisitions that wait on one resource
// get it in the order they came, each as soon as the one before releases,
// and while they wait only one of them asks the store: the holder's
// renewals and release do not queue behind a try per waiter.
func TestWaitersQueueInArrivalOrder(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		clock := newFakeClock() // leases never expire by themselves here
		spy := &countingStore{Store: k.open(t, clock)}
		e := newEnvWith(t, clock, spy, nil)
		holder := e.post("/v1/leases/job:1/acquire", `{"owner":"holder"}`)
		wantOK(t, "holder", holder)

		const n = 16
		got := make(chan answer, n)
		for i := range n {
			go func() {
				got <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", fmt.Sprintf(`{"owner":"w%d","wait_seconds":30}`, i))
			}()
			waitFor(t, fmt.Sprintf("waiter %d to queue", i), func() bool { return leaseapi.Waiting(e.api, "job:1") == i+1 })
		}

		// Half a second of waiting: the head's tries only (a poll of at
		// most 250 ms), not one or more per waiter.
		before := spy.acquires.Load()
		time.Sleep(500 * time.Millisecond)
		if tries := spy.acquires.Load() - before; tries >= n {
			t.Errorf("%d waiters asked the store %d times in 500 ms; only the head of the queue should", n, tries)
		}
		wantOK(t, "renew while they wait", e.post("/v1/leases/job:1/renew", fmt.Sprintf(`{"owner":"holder","token":%d}`, holder.num("token"))))

		owner, token := "holder", holder.num("token")
		for i := range n {
			wantOK(t, owner+" releases", e.post("/v1/leases/job:1/release", fmt.Sprintf(`{"owner":%q,"token":%d}`, owner, token)))
			a := <-got
			wantOK(t, "waiter", a)
			if want := fmt.Sprintf("w%d", i); a.str("owner") != want {
				t.Fatalf("after %s released, %s got the lease; want %s (arrival order)", owner, a.str("owner"), want)
			}
			owner, token = a.str("owner"), a.num("token")
		}
		if w := leaseapi.Waiting(e.api, "job:1"); w != 0 {
			t.Fatalf("%d waiters left in the queue", w)
		}
	})
}

// TestWaiterGoneReleasesItsLease: when the store gives a waiting
// acquisition the lease after its client hung up, the lease is released
// again, so the resource is not held until its TTL for no one; the next
// waiter gets it.
func TestWaiterGoneReleasesItsLease(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		clock := newFakeClock()
		spy := &countingStore{Store: k.open(t, clock), won: make(chan struct{}, 1)}
		e := newEnvWith(t, clock, spy, nil)
		holder := e.post("/v1/leases/job:1/acquire", `{"owner":"holder","ttl_seconds":3600}`)
		wantOK(t, "holder", holder)

		ctx, hangUp := context.WithCancel(context.Background())
		defer hangUp()
		gone := make(chan error, 1)
		go func() {
			r, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/leases/job:1/acquire",
				strings.NewReader(`{"owner":"gone","ttl_seconds":3600,"wait_seconds":30}`))
			r.Header.Set("Content-Type", "application/json")
			resp, err := e.srv.Client().Do(r)
			if err == nil {
				resp.Body.Close()
			}
			gone <- err
		}()
		waitFor(t, "the first waiter to queue", func() bool { return leaseapi.Waiting(e.api, "job:1") == 1 })
		next := make(chan answer, 1)
		go func() {
			next <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"next","wait_seconds":30}`)
		}()
		waitFor(t, "the second waiter to queue", func() bool { return leaseapi.Waiting(e.api, "job:1") == 2 })

		spy.holdWon.Store(true)
		wantOK(t, "release", e.post("/v1/leases/job:1/release", fmt.Sprintf(`{"owner":"holder","token":%d}`, holder.num("token"))))
		<-spy.won // the store gave "gone" the lease; its answer waits for the hang-up
		spy.holdWon.Store(false)
		hangUp()
		if err := <-gone; err == nil {
			t.Fatal("the hung-up request got an answer")
		}

		a := <-next
		wantOK(t, "next waiter", a)
		if a.str("owner") != "next" {
			t.Fatalf("next waiter: %s", a.raw)
		}
		st := e.get("/v1/leases/job:1")
		if prev := st.obj("previous"); prev == nil || prev["owner"] != "gone" || prev["ended"] != "released" {
			t.Fatalf("status %s: want the lease of the client that hung up released", st.raw)
		}
	})
}

// gatedStore holds the acquisitions of one owner, while gate is set, until
// open is closed (the head's try is in flight: a store round trip).
type gatedStore struct {
	fencing.Store
	owner   string
	gate    atomic.Bool
	blocked chan struct{}
	open    chan struct{}
}

func (s *gatedStore) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	if req.Owner == s.owner && s.gate.Load() {
		select {
		case s.blocked <- struct{}{}:
		default:
		}
		<-s.open
	}
	return s.Store.Acquire(ctx, req)
}

// TestWaiterWhoseWaitEndsDoesNotJumpTheQueue: w1 waits (30 s) and is the
// head of the queue; w2 comes later with a short wait (1 s). The holder's
// lease ends through another fencegate sharing the store (here: the store
// directly) while the head's next try is out. When w2's wait runs out
// before its turn, it answers lease-held with the holder the queue last
// saw, and the lease goes to w1 (docs/lease-api.md: waiters "get the lease
// in that order"). It used to try the store itself, and took the lease
// ahead of w1.
func TestWaiterWhoseWaitEndsDoesNotJumpTheQueue(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		clock := newFakeClock()
		gs := &gatedStore{Store: k.open(t, clock), owner: "w1", blocked: make(chan struct{}, 1), open: make(chan struct{})}
		e := newEnvWith(t, clock, gs, nil)
		holder := e.post("/v1/leases/job:1/acquire", `{"owner":"holder","ttl_seconds":3600}`)
		wantOK(t, "holder", holder)

		first := make(chan answer, 1)
		go func() {
			first <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"w1","wait_seconds":30}`)
		}()
		waitFor(t, "w1 to queue", func() bool { return leaseapi.Waiting(e.api, "job:1") == 1 })
		gs.gate.Store(true)
		second := make(chan answer, 1)
		go func() {
			second <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"w2","wait_seconds":1}`)
		}()
		waitFor(t, "w2 to queue behind w1", func() bool { return leaseapi.Waiting(e.api, "job:1") == 2 })
		<-gs.blocked // w1, the head, is trying again
		if _, err := gs.Store.Release(context.Background(), fencing.ReleaseRequest{Resource: "job:1", Owner: "holder", Token: fencing.Token(holder.num("token"))}); err != nil {
			t.Fatal(err)
		}
		b := <-second
		gs.gate.Store(false)
		close(gs.open)
		if b.status == http.StatusOK {
			// Let w1 finish at once (it would wait out its 30 s otherwise).
			e.post("/v1/leases/job:1/release", fmt.Sprintf(`{"owner":"w2","token":%d}`, b.num("token")))
			a := <-first
			t.Fatalf("w2, queued behind w1, got the lease first: %s (w1 got it only after w2 released: %d)", strings.TrimSpace(string(b.raw)), a.status)
		}
		wantProblem(t, "w2, whose wait ended before its turn", b, http.StatusConflict, "lease-held")
		wantOK(t, "w1, head of the queue", <-first)
	})
}

// TestHolderReacquiringWithAWaitIsNotQueued: the live holder acquires its
// own lease again with wait_seconds (DESIGN §2: a live lease of the same
// owner is extended, same token) while another owner waits in the queue:
// extended at once, as without a wait. It used to queue behind the waiter
// for its whole wait and then be refused lease-held, naming itself.
func TestHolderReacquiringWithAWaitIsNotQueued(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil) // fake clock: leases never expire by themselves
		holder := e.post("/v1/leases/job:1/acquire", `{"owner":"holder","ttl_seconds":30}`)
		wantOK(t, "holder", holder)

		other := make(chan answer, 1)
		go func() {
			other <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"other","wait_seconds":5}`)
		}()
		waitFor(t, "the other owner to queue", func() bool { return leaseapi.Waiting(e.api, "job:1") == 1 })

		// Without a wait, the store extends it at once (holds).
		wantOK(t, "holder re-acquires without wait", e.post("/v1/leases/job:1/acquire", `{"owner":"holder","ttl_seconds":30}`))
		// With a wait, the same call must do the same.
		again := e.post("/v1/leases/job:1/acquire", `{"owner":"holder","ttl_seconds":30,"wait_seconds":2}`)
		if again.status != http.StatusOK || again.num("token") != holder.num("token") {
			t.Errorf("holder re-acquiring its live lease with wait_seconds while another waits: status %d %s; want 200, token %d (extended at once)",
				again.status, again.raw, holder.num("token"))
		}
		wantOK(t, "release", e.post("/v1/leases/job:1/release", fmt.Sprintf(`{"owner":"holder","token":%d}`, holder.num("token"))))
		if a := <-other; a.status != http.StatusOK || a.str("owner") != "other" {
			t.Fatalf("the waiter after the release: %d %s", a.status, a.raw)
		}
	})
}

// TestWaitingAcquisitionsAreBounded: beyond MaxWaitingPerClient waiting
// acquisitions from one client address, or MaxWaiting in all, an
// acquisition with wait_seconds does not wait: it is answered at once, as
// without a wait. Over HTTP/2 one connection carries many streams, so the
// connection caps alone did not bound how many one client held (each a
// goroutine for up to a minute).
func TestWaitingAcquisitionsAreBounded(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*leaseapi.Options)
	}{
		{"per client", func(o *leaseapi.Options) { o.MaxWaitingPerClient = 2 }},
		{"in all", func(o *leaseapi.Options) { o.MaxWaiting = 2 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, storeKinds[0], c.set)
			holder := e.post("/v1/leases/job:1/acquire", `{"owner":"holder","ttl_seconds":30}`)
			wantOK(t, "holder", holder)
			waiting := make(chan answer, 2)
			for i := range 2 {
				go func() {
					waiting <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", fmt.Sprintf(`{"owner":"w%d","wait_seconds":30}`, i))
				}()
				waitFor(t, "a waiter to queue", func() bool { return leaseapi.Waiting(e.api, "job:1") == i+1 })
			}
			// A third waits nowhere: answered at once (its 30 s wait would
			// outlast the test's own deadline otherwise).
			third := e.post("/v1/leases/job:1/acquire", `{"owner":"w2","wait_seconds":30}`)
			if third.status != http.StatusConflict || third.str("code") != "lease-held" {
				t.Errorf("a third waiting acquisition beyond the bound: %d %s, want 409 lease-held at once", third.status, third.raw)
			}
			if n := leaseapi.Waiting(e.api, "job:1"); n != 2 {
				t.Errorf("%d waiting, want 2", n)
			}
			// The two that wait are served in turn; their slots come back.
			wantOK(t, "release", e.post("/v1/leases/job:1/release", fmt.Sprintf(`{"owner":"holder","token":%d}`, holder.num("token"))))
			first := <-waiting
			wantOK(t, "the first waiter", first)
			wantOK(t, "its release", e.post("/v1/leases/job:1/release", fmt.Sprintf(`{"owner":%q,"token":%d}`, first.str("owner"), first.num("token"))))
			wantOK(t, "the second waiter", <-waiting)
			waitFor(t, "the queue to empty", func() bool { return leaseapi.Waiting(e.api, "job:1") == 0 })
			late := make(chan answer, 1)
			go func() {
				late <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"w3","wait_seconds":30}`)
			}()
			waitFor(t, "a waiter to queue again once slots are free", func() bool { return leaseapi.Waiting(e.api, "job:1") == 1 })
			e.clock.Advance(time.Minute) // the second waiter's lease expires: w3 gets it
			wantOK(t, "the waiter after the slots came back", <-late)
		})
	}
}

// TestEndWaitsAnswersTheWaiters: when the server stops (EndWaits, called
// as the listeners shut down), an acquisition waiting for a held lease is
// answered 503 draining with Retry-After at once, nothing taken, instead
// of holding the drain for its whole wait and then finding its
// connection cut; a call that would wait from then on is answered at once,
// as without a wait.
func TestEndWaitsAnswersTheWaiters(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		wantOK(t, "holder", e.post("/v1/leases/job:1/acquire", `{"owner":"holder","ttl_seconds":3600}`))
		waiting := make(chan answer, 2)
		for _, owner := range []string{"w1", "w2"} { // the head and one behind it
			go func() {
				waiting <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"`+owner+`","wait_seconds":30}`)
			}()
		}
		waitFor(t, "both to wait", func() bool { return leaseapi.Waiting(e.api, "job:1") == 2 })
		e.api.EndWaits()
		for range 2 {
			a := <-waiting
			wantProblem(t, "a waiter when the server stops", a, http.StatusServiceUnavailable, "draining")
			if a.header.Get("Retry-After") == "" {
				t.Errorf("a waiter's draining answer has no Retry-After")
			}
		}
		late := e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"w3","wait_seconds":30}`)
		wantProblem(t, "a call that would wait after EndWaits", late, http.StatusConflict, "lease-held")
		if h := late.str("holder"); h != "holder" {
			t.Errorf("the lease is %q's after the stop, want the holder's", h)
		}
	})
}

// TestEndWaitsLetsATryAtTheStoreFinish: the head waiter's try is at the
// store when EndWaits is called, and the store grants it (the holder
// released meanwhile): the waiter is answered its lease, not 503 "nothing
// was taken" with a lease held in its name; the waiter behind it is
// answered 503 draining.
func TestEndWaitsLetsATryAtTheStoreFinish(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		clock := newFakeClock()
		gs := &gatedStore{Store: k.open(t, clock), owner: "w1", blocked: make(chan struct{}, 1), open: make(chan struct{})}
		e := newEnvWith(t, clock, gs, nil)
		holder := e.post("/v1/leases/job:1/acquire", `{"owner":"holder","ttl_seconds":3600}`)
		wantOK(t, "holder", holder)
		first, second := make(chan answer, 1), make(chan answer, 1)
		go func() {
			first <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"w1","wait_seconds":30}`)
		}()
		waitFor(t, "w1 to queue", func() bool { return leaseapi.Waiting(e.api, "job:1") == 1 })
		go func() {
			second <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"w2","wait_seconds":30}`)
		}()
		waitFor(t, "w2 to queue", func() bool { return leaseapi.Waiting(e.api, "job:1") == 2 })
		gs.gate.Store(true)
		<-gs.blocked // w1's next try is at the store
		if _, err := gs.Store.Release(context.Background(), fencing.ReleaseRequest{Resource: "job:1", Owner: "holder", Token: fencing.Token(holder.num("token"))}); err != nil {
			t.Fatal(err)
		}
		e.api.EndWaits()
		wantProblem(t, "w2, behind the head", <-second, http.StatusServiceUnavailable, "draining")
		gs.gate.Store(false)
		close(gs.open)
		a := <-first
		wantOK(t, "w1, whose try was at the store", a)
		if a.str("owner") != "w1" {
			t.Errorf("w1 was answered a lease of %q", a.str("owner"))
		}
	})
}
