package proxy

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestDoomedTokenFloodDoesNotStarveTheHolder: hundreds of connections keep
// sending a stale token for one resource while its holder writes. The
// store refuses every stale write, and each refused admission is held
// until the next one has registered, so a stale write is always
// registered at the barrier for as long as the flood runs. The holder's writes must still be forwarded:
// a write waits only for lower tokens registered before its own admission
// returned. Were it to wait for every registered lower token, as it once
// did, each holder write would end in barrier-timeout.
func TestDoomedTokenFloodDoesNotStarveTheHolder(t *testing.T) {
	const flooders = 500
	clock := newFakeClock()
	var (
		stale    atomic.Uint64 // set once the server runs: read by the admissions
		mu       sync.Mutex
		parked   chan struct{} // the refused admission currently held back
		refused  atomic.Int64
		stopped  = make(chan struct{})
		stopOnce sync.Once
	)
	stop := func() { stopOnce.Do(func() { close(stopped) }) }
	t.Cleanup(stop) // before the servers close, should the test stop early
	e := newEnvStore(t, testRules, admitHook{
		Store: memstore.New(memstore.Options{Clock: clock}),
		hook: func(req fencing.AdmitRequest, admit func() (fencing.Admission, error)) (fencing.Admission, error) {
			a, err := admit()
			if err == nil || uint64(req.Token) != stale.Load() {
				return a, err
			}
			refused.Add(1)
			mine := make(chan struct{})
			mu.Lock()
			if parked != nil {
				close(parked) // the next doomed write has registered: let the last one go
			}
			parked = mine
			mu.Unlock()
			select {
			case <-mine:
			case <-stopped:
			}
			return a, err
		},
	}, clock) // the default BarrierTimeout: its expiry is the failure this test looks for

	old := e.acquire("job:1", "old", 10*time.Second)
	clock.Advance(11 * time.Second)
	holder := e.acquire("job:1", "holder", time.Hour)
	stale.Store(uint64(old.Token))
	if r := e.do("PUT", "/jobs/1", "first", HeaderToken, tok(holder.Token)); r.Status != 200 {
		t.Fatalf("holder's first write: %d %s", r.Status, r.Body)
	}

	flood := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: flooders}, Timeout: time.Minute}
	t.Cleanup(flood.CloseIdleConnections)
	var wg sync.WaitGroup
	var unexpected atomic.Value
	for range flooders {
		wg.Go(func() {
			for {
				select {
				case <-stopped:
					return
				default:
				}
				r, err := doReq(flood, e.gateSrv.URL, "PUT", "/jobs/1", "stale", HeaderToken, tok(fencing.Token(stale.Load())))
				if err == nil && r.Status != http.StatusConflict {
					unexpected.Store(r.Status)
				}
				// Paced, to leave the holder some CPU on a small machine:
				// with the relay above, one doomed write stays registered
				// whatever the rate.
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	waitFor(t, "the flood to be refused", func() bool { return refused.Load() >= 50 })

	for i := range 3 {
		r := e.do("PUT", "/jobs/1", "holder", HeaderToken, tok(holder.Token))
		if r.Status != 200 {
			stop()
			wg.Wait()
			t.Fatalf("holder write %d during the flood: %d %s", i, r.Status, r.Body)
		}
	}
	stop()
	wg.Wait()
	if s := unexpected.Load(); s != nil {
		t.Fatalf("a stale write was answered %v, want 409", s)
	}
	for _, g := range e.up.requests() {
		if g.Token != tok(holder.Token) {
			t.Fatalf("the upstream received a write with token %s", g.Token)
		}
	}
	if n := e.up.count(); n != 4 {
		t.Fatalf("the upstream received %d writes, want 4", n)
	}
	t.Logf("%d stale writes refused during the run", refused.Load())
	waitFor(t, "the barrier to empty", func() bool { return e.gate.InFlightResources() == 0 })
}
