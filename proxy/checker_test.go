package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// orderChecker is an upstream that applies writes and checks, per
// resource, that the tokens it applies never decrease. It also counts how
// often it applied each write id.
type orderChecker struct {
	mu         sync.Mutex
	last       map[string]fencing.Token
	applied    map[string]int
	violations []string
}

func (o *orderChecker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	if r.Method == http.MethodGet {
		return
	}
	res := r.Header.Get(HeaderResource)
	t, err := fencing.ParseToken(r.Header.Get(HeaderToken))
	if err != nil {
		http.Error(w, "bad token", 400)
		return
	}
	o.mu.Lock()
	if t < o.last[res] {
		o.violations = append(o.violations, fmt.Sprintf("%s: applied token %d after %d", res, t, o.last[res]))
	}
	o.last[res] = t
	o.applied[string(body)]++
	o.mu.Unlock()
	// Answer after a short, random delay: writes overlap in flight.
	time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
	w.WriteHeader(http.StatusNoContent)
}

// jitter delays each request by up to max before the gate sends it, so
// writes overlap on the way to the upstream.
func jitter(max time.Duration) func() {
	return func() { time.Sleep(time.Duration(rand.Int64N(int64(max)))) }
}

// TestConcurrencyChecker: 16 workers take 1 s leases on 3 resources, write
// with random pauses (some longer than the lease, making them zombies,
// some releasing the lease with a write still on its way, some
// deliberately reusing an old token), through the gate to an upstream
// that checks per-resource token order. Every write must end applied
// exactly once (2xx) or refused with a problem body and never applied.
// It runs on the memory store, and on it through a batch path and through
// mark readers (the loops admitting in batches and reading marks
// themselves, as with the Valkey store).
func TestConcurrencyChecker(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		checkConcurrency(t, memstore.New(memstore.Options{}))
	})
	t.Run("batched", func(t *testing.T) {
		t.Parallel()
		checkConcurrency(t, &batchedStore{Store: memstore.New(memstore.Options{})})
	})
	if newMarkedVariant != nil {
		t.Run("marked", func(t *testing.T) {
			t.Parallel()
			checkConcurrency(t, newMarkedVariant(memstore.New(memstore.Options{})))
		})
	}
}

func checkConcurrency(t *testing.T, st fencing.Store) {
	const (
		workers  = 16
		duration = 4 * time.Second
	)
	resources := []string{"r1", "r2", "r3"}
	up := &orderChecker{last: map[string]fencing.Token{}, applied: map[string]int{}}
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	u, _ := url.Parse(upSrv.URL)
	g, err := New(Options{Upstream: u, Store: st, ResourceHeader: true, UpstreamTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g.beforeSend = jitter(5 * time.Millisecond)
	g.barrierOff = mutateNoBarrier
	srv := serveGate(t, g)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * workers}, Timeout: 30 * time.Second}

	type outcome struct {
		id     string
		status int
		code   string
		err    error
	}
	var mu sync.Mutex
	var outcomes []outcome
	record := func(o outcome) {
		mu.Lock()
		outcomes = append(outcomes, o)
		mu.Unlock()
	}
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			owner := fmt.Sprintf("worker-%d", w)
			old := map[string]fencing.Token{}
			for n := 0; time.Now().Before(deadline); n++ {
				res := resources[rng.IntN(len(resources))]
				l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Second})
				if err != nil {
					if !errors.Is(err, fencing.ErrLeaseHeld) {
						record(outcome{err: err})
						return
					}
					time.Sleep(time.Duration(1+rng.IntN(5)) * time.Millisecond)
					continue
				}
				// Either write for 0.8 to 1.3 s, often past the 1 s lease,
				// so the last writes race the next holder's first ones; or
				// write for 50 to 150 ms and release the lease while a last
				// write is still on its way (a worker that gave up waiting
				// for it), so the next holder's first writes race that one.
				short := rng.IntN(2) == 0
				until := time.Now().Add(time.Duration(800+rng.IntN(500)) * time.Millisecond)
				if short {
					until = time.Now().Add(time.Duration(50+rng.IntN(100)) * time.Millisecond)
				}
				send := func(id string, token fencing.Token, wg *sync.WaitGroup) {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r, err := doReq(client, srv.URL, "POST", "/write", id, HeaderResource, res, HeaderToken, token.String())
						oc := outcome{id: id, status: r.Status, err: err}
						if r.Problem != nil {
							oc.code, _ = r.Problem["code"].(string)
						}
						record(oc)
					}()
				}
				for k := 0; time.Now().Before(until); k++ {
					token := l.Token
					if o := old[res]; o != 0 && rng.IntN(10) == 0 {
						token = o // a zombie's late write
					}
					burst := 1 + rng.IntN(2)
					var bw sync.WaitGroup
					for b := range burst {
						send(fmt.Sprintf("%s/%d/%d/%d", owner, n, k, b), token, &bw)
					}
					bw.Wait()
					time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
				}
				old[res] = l.Token
				if short {
					send(fmt.Sprintf("%s/%d/last", owner, n), l.Token, &wg) // awaited with the workers
					_, _ = st.Release(context.Background(), fencing.ReleaseRequest{Resource: res, Owner: owner, Token: l.Token})
				} else if rng.IntN(3) == 0 {
					_, _ = st.Release(context.Background(), fencing.ReleaseRequest{Resource: res, Owner: owner, Token: l.Token})
				}
			}
		}()
	}
	wg.Wait()

	up.mu.Lock()
	defer up.mu.Unlock()
	for _, v := range up.violations {
		t.Error(v)
	}
	counts := map[string]int{}
	for _, o := range outcomes {
		if o.err != nil {
			t.Fatalf("transport or store error: %v", o.err)
		}
		switch {
		case o.status == http.StatusNoContent:
			counts["applied"]++
			if n := up.applied[o.id]; n != 1 {
				t.Errorf("write %s answered %d but applied %d times", o.id, o.status, n)
			}
		case o.code != "" && (o.status == 409 || o.status == 503):
			counts[o.code]++
			if n := up.applied[o.id]; n != 0 {
				t.Errorf("write %s refused %s but applied %d times", o.id, o.code, n)
			}
		default:
			t.Errorf("write %s: unexpected outcome %d %q", o.id, o.status, o.code)
		}
	}
	if len(up.applied) != counts["applied"] {
		t.Errorf("upstream applied %d distinct writes, clients saw %d applied", len(up.applied), counts["applied"])
	}
	if counts["applied"] == 0 || counts["stale-token"] == 0 {
		t.Errorf("the run did not exercise both outcomes: %v", counts)
	}
	t.Logf("outcomes: %v", counts)
	if n := g.InFlightResources(); n != 0 {
		t.Errorf("barrier still tracks %d resources", n)
	}
}

// mutateNoBarrier turns the barrier off in the checker. Set it to true by
// hand to see the checker catch the reordering the barrier prevents: on
// the event loops every variant failed in 9 runs of 9 (about three
// reorderings a run), where before the workers released leases with a
// write on its way it caught 9 of 15.
var mutateNoBarrier = false
