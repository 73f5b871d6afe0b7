package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestSharedBarrier runs gates that share one Valkey (a single node, then a
// 3-node cluster) or one PostgreSQL database, each gate with its own store
// client, as separate replicas of a service would.
func TestSharedBarrier(t *testing.T) {
	// The three stores side by side: most of each run is waiting on its
	// store and on the slow gate's added latency.
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		srv := valkeytest.Start(t)
		testSharedBarrierOn(t, valkeyKit(srv.URL(), []*valkeytest.Server{srv}))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := valkeytest.StartCluster(t, 3)
		testSharedBarrierOn(t, valkeyKit(cl.URL(), cl.Nodes))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		testSharedBarrierOn(t, postgresKit(t))
	})
}

// sharedStore is a store with a shared barrier.
type sharedStore interface {
	fencing.Store
	fencing.SharedBarrier
}

// storeKit is how the shared-barrier tests reach one kind of store: open
// a client in namespace ns (a key prefix or a schema: lower-case letters
// and digits), the store's clock in Unix ms, and the deadline (by that
// clock) of the one barrier entry of a resource. A kit whose store is one
// server also has its TCP address, a client through another address (a
// proxy in front of it), and the count of a gate's entries for a resource.
type storeKit struct {
	open        func(t testing.TB, ns string) sharedStore
	now         func(t testing.TB) int64
	deadline    func(t testing.TB, ns, resource string) int64
	addr        string
	via         func(t testing.TB, ns, addr string, timeout time.Duration) sharedStore // timeout: the store's dial and command timeouts
	gateEntries func(t testing.TB, ns, resource, gate string) int
}

func valkeyKit(storeURL string, nodes []*valkeytest.Server) storeKit {
	open := func(t testing.TB, opts valkeystore.Options) sharedStore {
		st, err := valkeystore.Open(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	kit := storeKit{
		open: func(t testing.TB, ns string) sharedStore {
			return open(t, valkeystore.Options{URL: storeURL, KeyPrefix: ns})
		},
		now: func(t testing.TB) int64 { return storeMillis(t, nodes[0]) },
		deadline: func(t testing.TB, ns, resource string) int64 {
			return entryDeadline(t, nodes, ns, resource)
		},
	}
	if len(nodes) == 1 { // a cluster announces its nodes' own addresses: no proxy
		kit.addr = nodes[0].Addr()
		kit.via = func(t testing.TB, ns, addr string, timeout time.Duration) sharedStore {
			return open(t, valkeystore.Options{URL: "valkey://" + addr, KeyPrefix: ns, DialTimeout: timeout, CommandTimeout: timeout})
		}
		kit.gateEntries = func(t testing.TB, ns, resource, gate string) int {
			out, err := nodes[0].Do("ZRANGE", ns+":{"+resource+"}:bar", "0", "-1")
			if err != nil {
				t.Fatal(err)
			}
			return strings.Count(out, "|"+gate+":") // members "<deadline ms>|<gate id>:<instance>:<seq>"
		}
	}
	return kit
}

func testSharedBarrierOn(t *testing.T, kit storeKit) {
	t.Run("handoffs/shared", func(t *testing.T) {
		start := time.Now()
		// 5,000 writes: the local run below finds its first order
		// violation within about 100 to 1,300 writes on these stores.
		r := runHandoffs(t, kit, true, 5_000)
		t.Logf("%d writes in %v", r.writes, time.Since(start).Round(time.Millisecond))
		if r.writes < 5_000 || r.applied < r.writes/4 || r.stale == 0 {
			t.Errorf("the run did not exercise the barrier: %+v", r)
		}
		for _, v := range r.violations {
			t.Error(v)
		}
		t.Logf("shared: %+v", r)
	})
	t.Run("handoffs/local", func(t *testing.T) {
		// The same harness with each gate ordering only its own writes:
		// it must catch the reordering the shared barrier prevents.
		r := runHandoffs(t, kit, false, 5_000)
		if len(r.violations) == 0 {
			t.Errorf("no order violation with local barriers in %d writes: the harness cannot tell", r.writes)
		}
		t.Logf("local: %d violations in %+v", len(r.violations), r)
	})
	t.Run("dead-gate", func(t *testing.T) { testDeadGate(t, kit) })
}

type handoffResult struct {
	writes, applied, stale int
	violations             []string
}

// runHandoffs sends fenced writes through two gates on one store, in
// handoffs: on each of 8 resources, the old holder keeps writing through
// the gate whose path to the upstream is slow (0 to 3 ms of added latency)
// while the next holder takes the lease and writes through both gates,
// and the old holder, as if paused, sends more writes once the next one
// writes: each of those is admitted before the next holder's (which then
// waits for it) or refused as stale, whatever the store's speed. An
// upstream checks that each resource's tokens never go down. It stops
// after at least minWrites writes (local: at the first violation).
func runHandoffs(t *testing.T, kit storeKit, shared bool, minWrites int) handoffResult {
	t.Helper()
	up := &orderChecker{last: map[string]fencing.Token{}, applied: map[string]int{}}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	u, _ := url.Parse(upSrv.URL)
	prefix := fmt.Sprintf("handoff%d", time.Now().UnixNano())
	openStore := func() sharedStore { return kit.open(t, prefix) }
	var gates [2]string
	for i := range gates {
		st := openStore()
		opts := Options{Upstream: u, Store: st, ResourceHeader: true, UpstreamTimeout: 10 * time.Second}
		if shared {
			opts.SharedBarrier, opts.GateID = st, fmt.Sprintf("gate-%d", i)
		}
		g, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			g.beforeSend = jitter(3 * time.Millisecond)
		}
		s := serveGate(t, g)
		gates[i] = s.URL
	}
	leases := openStore()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)

	var (
		mu       sync.Mutex
		res      handoffResult
		sent     atomic.Int64
		failures []string
	)
	stop := func() bool {
		if sent.Load() >= int64(minWrites) {
			return true
		}
		if !shared {
			up.mu.Lock()
			defer up.mu.Unlock()
			return len(up.violations) > 0
		}
		return false
	}
	write := func(gate, resource string, token fencing.Token, id string) {
		sent.Add(1)
		r, err := doReq(client, gate, "POST", "/write", id, HeaderResource, resource, HeaderToken, token.String())
		code := ""
		if r.Problem != nil {
			code, _ = r.Problem["code"].(string)
		}
		mu.Lock()
		defer mu.Unlock()
		res.writes++
		up.mu.Lock()
		applied := up.applied[id]
		up.mu.Unlock()
		switch {
		case err != nil:
			failures = append(failures, fmt.Sprintf("write %s: %v", id, err))
		case r.Status == http.StatusNoContent && applied == 1:
			res.applied++
		case r.Status == http.StatusConflict && code == "stale-token" && applied == 0:
			res.stale++
		default:
			failures = append(failures, fmt.Sprintf("write %s: %d %q, applied %d times", id, r.Status, code, applied))
		}
	}
	const burst = 6
	var wg sync.WaitGroup
	for ri := range 8 {
		resource := fmt.Sprintf("doc:%d", ri)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			prev, err := leases.Acquire(ctx, fencing.AcquireRequest{Resource: resource, Owner: "w0", TTL: time.Minute})
			if err != nil {
				t.Error(err)
				return
			}
			for e := 1; !stop(); e++ {
				var bw sync.WaitGroup
				// send makes n writes with token, write k through gate(k),
				// each on a goroutine of bw.
				send := func(n int, gate func(k int) string, token fencing.Token, kind string) {
					for k := range n {
						bw.Add(1)
						go func() {
							defer bw.Done()
							write(gate(k), resource, token, fmt.Sprintf("%s/%d/%s/%d", resource, e, kind, k))
						}()
					}
				}
				slow := func(int) string { return gates[1] }
				send(burst, slow, prev.Token, "old") // the old holder keeps writing, through the slow gate
				// The harness's own lease calls are tried again after a
				// fault (a command past the store's timeout on a busy
				// machine): both are safe to repeat (a release of a lease
				// already ended answers released: false; an acquisition
				// by the holder extends its lease, same token).
				if err := retried(t, func() error {
					_, err := leases.Release(ctx, fencing.ReleaseRequest{Resource: resource, Owner: prev.Owner, Token: prev.Token})
					return err
				}); err != nil {
					t.Error(err)
					return
				}
				var next fencing.Lease
				if err := retried(t, func() (err error) {
					next, err = leases.Acquire(ctx, fencing.AcquireRequest{Resource: resource, Owner: fmt.Sprintf("w%d", e), TTL: time.Minute})
					return err
				}); err != nil {
					t.Error(err)
					return
				}
				send(burst, func(k int) string { return gates[k%2] }, next.Token, "new") // the new holder writes through both gates
				send(burst/2, slow, prev.Token, "late")                                  // and the old holder, paused until now, writes beside it
				bw.Wait()
				prev = next
			}
		}()
	}
	wg.Wait()
	for _, f := range failures[:min(len(failures), 10)] {
		t.Error(f)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	res.violations = up.violations
	return res
}

// retried runs call until it succeeds, at most three times, logging each
// fault, and returns the last error.
func retried(t *testing.T, call func() error) error {
	var err error
	for range 3 {
		if err = call(); err == nil || !(errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous)) {
			return err
		}
		t.Logf("lease call tried again after: %v", err)
	}
	return err
}

// testDeadGate: a gate dies (its store client is closed: it can never
// remove its entry) while its write is at the upstream. The next holder's
// write through another gate must not reach the upstream before the dead
// gate's entry's deadline by the store's clock, and must reach it soon
// after (within the wait's bounded re-check, with a loose margin).
func testDeadGate(t *testing.T, kit storeKit) {
	prefix := fmt.Sprintf("dead%d", time.Now().UnixNano())
	const resource = "doc:dead"
	type arrival struct {
		token  fencing.Token
		server int64 // the store's TIME, ms
	}
	arrivals := make(chan arrival, 4)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		tk, _ := fencing.ParseToken(r.Header.Get(HeaderToken))
		arrivals <- arrival{tk, kit.now(t)}
		if r.Header.Get("X-Hang") != "" {
			select { // the dead gate's write: the upstream never answers it
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) })
	u, _ := url.Parse(up.URL)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	gate := func(id string, barrierTimeout, bodyTimeout, upstreamTimeout, grace time.Duration) (sharedStore, string) {
		st := kit.open(t, prefix)
		g, err := New(Options{Upstream: u, Store: st, ResourceHeader: true, SharedBarrier: st, GateID: id,
			BarrierTimeout: barrierTimeout, BodyTimeout: bodyTimeout, UpstreamTimeout: upstreamTimeout, TimeoutGrace: grace, MeterProvider: mp})
		if err != nil {
			t.Fatal(err)
		}
		s := serveGate(t, g)
		return st, s.URL
	}
	deadStore, deadURL := gate("gate-dead", 200*time.Millisecond, 200*time.Millisecond, 400*time.Millisecond, 400*time.Millisecond) // entries live 1.2 s
	_, liveURL := gate("gate-live", 10*time.Second, time.Second, 10*time.Second, time.Second)

	ctx := context.Background()
	old, err := deadStore.Acquire(ctx, fencing.AcquireRequest{Resource: resource, Owner: "old", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _ = doReq(http.DefaultClient, deadURL, "POST", "/write", "old", HeaderResource, resource, HeaderToken, old.Token.String(), "X-Hang", "1")
	}()
	if a := <-arrivals; a.token != old.Token {
		t.Fatalf("upstream got token %d first, want %d", a.token, old.Token)
	}
	deadline := kit.deadline(t, prefix, resource)
	deadStore.Close() // the gate dies: its entry can only expire

	client := kit.open(t, prefix)
	if _, err := client.Release(ctx, fencing.ReleaseRequest{Resource: resource, Owner: "old", Token: old.Token}); err != nil {
		t.Fatal(err)
	}
	next, err := client.Acquire(ctx, fencing.AcquireRequest{Resource: resource, Owner: "next", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	r, err := doReq(http.DefaultClient, liveURL, "POST", "/write", "next", HeaderResource, resource, HeaderToken, next.Token.String())
	if err != nil || r.Status != http.StatusNoContent {
		t.Fatalf("next holder's write: %v %d %v", err, r.Status, r.Problem)
	}
	a := <-arrivals
	if a.token != next.Token {
		t.Fatalf("upstream got token %d, want %d", a.token, next.Token)
	}
	if a.server < deadline {
		t.Fatalf("token %d reached the upstream at %d ms, before the dead gate's entry's deadline %d ms", a.token, a.server, deadline)
	}
	if late := a.server - deadline; late > 5000 {
		t.Errorf("token %d reached the upstream %d ms after the dead gate's entry's deadline", a.token, late)
	}
	if n := sumInt(t, reader, MetricSharedExpired); n != 1 {
		t.Errorf("%s = %d, want 1 (the dead gate's entry)", MetricSharedExpired, n)
	}
	if n := sumInt(t, reader, MetricSharedWaits); n != 1 {
		t.Errorf("%s = %d, want 1", MetricSharedWaits, n)
	}
}

// sumInt is the sum of an Int64 counter's data points.
func sumInt(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	m, ok := collect(t, r, name)
	if !ok {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		n += dp.Value
	}
	return n
}

// storeMillis is the store's TIME in milliseconds.
func storeMillis(t testing.TB, srv *valkeytest.Server) int64 {
	out, err := srv.Do("TIME")
	if err != nil {
		t.Error(err)
		return 0
	}
	f := strings.Fields(out)
	sec, _ := strconv.ParseInt(f[0], 10, 64)
	usec, _ := strconv.ParseInt(f[1], 10, 64)
	return sec*1000 + usec/1000
}

// entryDeadline reads the deadline of the one shared-barrier entry of
// resource (valkeystore's layout: P:{R}:bar, members "<deadline ms>|...").
func entryDeadline(t testing.TB, nodes []*valkeytest.Server, prefix, resource string) int64 {
	t.Helper()
	var errs []error
	for _, n := range nodes {
		out, err := n.Do("ZRANGE", prefix+":{"+resource+"}:bar", "0", "-1")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		members := strings.Fields(out)
		if len(members) != 1 {
			t.Fatalf("%d barrier entries, want 1: %q", len(members), out)
		}
		dl, err := strconv.ParseInt(members[0][:strings.IndexByte(members[0], '|')], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return dl
	}
	t.Fatalf("no node holds the entry: %v", errors.Join(errs...))
	return 0
}

func TestSharedBarrierNeedsGateID(t *testing.T) {
	srv := valkeytest.Start(t)
	st, err := valkeystore.Open(context.Background(), valkeystore.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	u, _ := url.Parse("http://127.0.0.1:1")
	if _, err := New(Options{Upstream: u, Store: st, SharedBarrier: st}); err == nil || !strings.Contains(err.Error(), "GateID") {
		t.Fatalf("New with a shared barrier and no GateID: %v", err)
	}
}

// TestSharedBarrierStoreFaultWhileWaiting: a write waiting behind another
// gate's lower-token entry when the store goes away fails closed: 503
// store-unavailable, and nothing reaches the upstream.
func TestSharedBarrierStoreFaultWhileWaiting(t *testing.T) {
	srv := valkeytest.Start(t)
	ctx := context.Background()
	openStore := func() *valkeystore.Store {
		st, err := valkeystore.Open(ctx, valkeystore.Options{URL: srv.URL(), KeyPrefix: "fault", DialTimeout: time.Second, CommandTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	other, mine := openStore(), openStore()
	var forwarded atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { forwarded.Add(1) }))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	g, err := New(Options{Upstream: u, Store: mine, ResourceHeader: true, SharedBarrier: mine, GateID: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)

	old, err := other.Acquire(ctx, fencing.AcquireRequest{Resource: "doc:f", Owner: "old", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := other.AdmitRegister(ctx, fencing.AdmitRequest{Resource: "doc:f", Token: old.Token}, "other", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Release(ctx, fencing.ReleaseRequest{Resource: "doc:f", Owner: "old", Token: old.Token}); err != nil {
		t.Fatal(err)
	}
	next, err := other.Acquire(ctx, fencing.AcquireRequest{Resource: "doc:f", Owner: "next", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan response, 1)
	go func() {
		r, err := doReq(http.DefaultClient, gs.URL, "POST", "/w", "x", HeaderResource, "doc:f", HeaderToken, next.Token.String())
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, "the write to wait on the resource's channel", func() bool {
		out, err := srv.Do("PUBSUB", "SHARDNUMSUB", "fault:{doc:f}:bar:ch")
		return err == nil && strings.HasSuffix(out, "\n1")
	})
	srv.Kill()
	r := <-done
	wantProblem(t, r, http.StatusServiceUnavailable, "store-unavailable")
	if n := forwarded.Load(); n != 0 {
		t.Fatalf("%d writes reached the upstream while the store was gone", n)
	}
}
