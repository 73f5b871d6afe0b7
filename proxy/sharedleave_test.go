package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
	"github.com/fencegate/fencegate/internal/syncbuf"
)

// TestSharedBarrierLeaveRetried: the store becomes unreachable from a gate
// exactly when a write's answer is over, so removing its entry fails. Once
// the store is reachable again, the gate removes the entry before its
// deadline by the store's clock, and the next holder's write through
// another gate reaches the upstream before that deadline too: it does not
// wait out the lifetime of an entry whose write has ended.
func TestSharedBarrierLeaveRetried(t *testing.T) {
	t.Run("valkey", func(t *testing.T) {
		srv := valkeytest.Start(t)
		testLeaveRetried(t, valkeyKit(srv.URL(), []*valkeytest.Server{srv}))
	})
	t.Run("postgres", func(t *testing.T) { testLeaveRetried(t, postgresKit(t)) })
}

func testLeaveRetried(t *testing.T, kit storeKit) {
	prefix := fmt.Sprintf("leave%d", time.Now().UnixNano())
	const resource = "doc:leave"
	ctx := context.Background()
	cut := newCutProxy(t, kit.addr)

	arrived := make(chan struct{}) // the first write is at the upstream
	answer := make(chan struct{})  // let the upstream answer it
	var secondAt atomic.Int64      // the store's clock (ms) when the second write arrived
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-First") != "" {
			close(arrived)
			<-answer
		} else {
			secondAt.Store(kit.now(t))
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	// Gate A reaches the store through the proxy; its entries live 15 s.
	stA := kit.via(t, prefix, cut.addr(), time.Second)
	gA, err := New(Options{Upstream: u, Store: stA, ResourceHeader: true, SharedBarrier: stA, GateID: "gate-a",
		BarrierTimeout: 5 * time.Second, BodyTimeout: 2 * time.Second, UpstreamTimeout: 5 * time.Second, TimeoutGrace: 3 * time.Second, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = gA.Close(ctx) }) // after the server's Close: cleanups run last first
	sA := serveGate(t, gA)
	// Gate B reaches it directly, and would wait longer than A's entries
	// live: without the retry its write would wait for the deadline.
	stB := kit.open(t, prefix)
	gB, err := New(Options{Upstream: u, Store: stB, ResourceHeader: true, SharedBarrier: stB, GateID: "gate-b",
		BarrierTimeout: time.Minute, UpstreamTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = gB.Close(ctx) })
	sB := serveGate(t, gB)

	old, err := stB.Acquire(ctx, fencing.AcquireRequest{Resource: resource, Owner: "old", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan answered, 1)
	go func() {
		r, err := doReq(http.DefaultClient, sA.URL, "POST", "/w", "first", HeaderResource, resource, HeaderToken, old.Token.String(), "X-First", "1")
		first <- answered{r, err}
	}()
	<-arrived
	deadline := kit.deadline(t, prefix, resource)
	cut.cut() // the store is unreachable from gate A as the write ends
	close(answer)
	if a := <-first; a.err != nil || a.r.Status != http.StatusNoContent {
		t.Fatalf("first write: %v %d %v", a.err, a.r.Status, a.r.Problem)
	}
	waitFor(t, "a retried removal to fail while the store is unreachable", func() bool {
		return sumOutcome(t, reader, MetricSharedLeaveRetries, attrOutcome, "failed") > 0
	})
	if n := kit.gateEntries(t, prefix, resource, "gate-a"); n != 1 {
		t.Fatalf("gate A has %d entries for the resource while the store is unreachable, want 1", n)
	}

	if _, err := stB.Release(ctx, fencing.ReleaseRequest{Resource: resource, Owner: "old", Token: old.Token}); err != nil {
		t.Fatal(err)
	}
	next, err := stB.Acquire(ctx, fencing.AcquireRequest{Resource: resource, Owner: "next", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cut.mend()
	second := make(chan answered, 1)
	go func() {
		r, err := doReq(http.DefaultClient, sB.URL, "POST", "/w", "second", HeaderResource, resource, HeaderToken, next.Token.String())
		second <- answered{r, err}
	}()
	for {
		n := kit.gateEntries(t, prefix, resource, "gate-a")
		now := kit.now(t) // read after the count: a removal seen was done by now
		if now >= deadline {
			t.Fatalf("gate A's entry was registered until %d ms, its deadline %d ms: the failed removal was not retried", now, deadline)
		}
		if n == 0 {
			t.Logf("gate A's entry removed %d ms before its deadline", deadline-now)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if a := <-second; a.err != nil || a.r.Status != http.StatusNoContent {
		t.Fatalf("second write: %v %d %v", a.err, a.r.Status, a.r.Problem)
	}
	if at := secondAt.Load(); at >= deadline {
		t.Errorf("the second write reached the upstream at %d ms, after gate A's entry's deadline %d ms", at, deadline)
	}
	if n := sumOutcome(t, reader, MetricSharedLeaveRetries, attrOutcome, "removed"); n != 1 {
		t.Errorf("%s{outcome=removed} = %d, want 1", MetricSharedLeaveRetries, n)
	}
	if n := sumInt(t, reader, MetricSharedLeavesAbandoned); n != 0 {
		t.Errorf("%s = %d, want 0", MetricSharedLeavesAbandoned, n)
	}
}

// TestSharedBarrierLeaveRetriesEnd: retries of a removal that keeps
// failing end when the entry's lifetime has passed (the store ignores it
// then) and when the gate stops, counted by reason; Close waits for the
// retry worker either way.
func TestSharedBarrierLeaveRetriesEnd(t *testing.T) {
	srv := valkeytest.Start(t)
	kit := valkeyKit(srv.URL(), []*valkeytest.Server{srv})
	for _, tc := range []struct {
		reason   string
		lifetime time.Duration // BarrierTimeout, BodyTimeout, UpstreamTimeout: a third each
	}{
		{"expired", 1500 * time.Millisecond},
		{"stopping", time.Minute},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			ctx := context.Background()
			prefix := fmt.Sprintf("leaveend%d", time.Now().UnixNano())
			cut := newCutProxy(t, kit.addr)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				cut.cut() // the store is unreachable from the gate as the write ends
				w.WriteHeader(http.StatusNoContent)
			}))
			t.Cleanup(up.Close)
			u, _ := url.Parse(up.URL)
			reader := sdkmetric.NewManualReader()
			st := kit.via(t, prefix, cut.addr(), time.Second)
			third := tc.lifetime / 3
			g, err := New(Options{Upstream: u, Store: st, ResourceHeader: true, SharedBarrier: st, GateID: "gate-a",
				BarrierTimeout: third, BodyTimeout: third, UpstreamTimeout: third, TimeoutGrace: NoGrace,
				MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
			if err != nil {
				t.Fatal(err)
			}
			s := serveGate(t, g)
			lease, err := kit.open(t, prefix).Acquire(ctx, fencing.AcquireRequest{Resource: "doc:end", Owner: "w", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			r, err := doReq(http.DefaultClient, s.URL, "POST", "/w", "", HeaderResource, "doc:end", HeaderToken, lease.Token.String())
			if err != nil || r.Status != http.StatusNoContent {
				t.Fatalf("write: %v %d %v", err, r.Status, r.Problem)
			}
			waitFor(t, "a retried removal to fail", func() bool {
				return sumOutcome(t, reader, MetricSharedLeaveRetries, attrOutcome, "failed") > 0
			})
			if tc.reason == "expired" {
				waitFor(t, "the retries to end at the entry's lifetime", func() bool {
					return sumOutcome(t, reader, MetricSharedLeavesAbandoned, attrReason, "expired") > 0
				})
			}
			s.Close()
			if _, err := g.Close(ctx); err != nil {
				t.Fatal(err)
			}
			// Close has waited for the worker: its counts are final.
			if n := sumOutcome(t, reader, MetricSharedLeavesAbandoned, attrReason, tc.reason); n != 1 {
				t.Errorf("%s{reason=%s} = %d, want 1", MetricSharedLeavesAbandoned, tc.reason, n)
			}
			if n := sumInt(t, reader, MetricSharedLeavesAbandoned); n != 1 {
				t.Errorf("%s = %d, want 1", MetricSharedLeavesAbandoned, n)
			}
			if n := sumOutcome(t, reader, MetricSharedLeaveRetries, attrOutcome, "removed"); n != 0 {
				t.Errorf("%s{outcome=removed} = %d, want 0", MetricSharedLeaveRetries, n)
			}
		})
	}
}

// answered is a request's response, or the error that came instead.
type answered struct {
	r   response
	err error
}

// sumOutcome is the sum of an Int64 counter's data points whose attribute
// key is value.
func sumOutcome(t *testing.T, r *sdkmetric.ManualReader, name string, key attribute.Key, value string) int64 {
	t.Helper()
	m, ok := collect(t, r, name)
	if !ok {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value(key); ok && v.AsString() == value {
			n += dp.Value
		}
	}
	return n
}

// cutProxy relays TCP connections from a loopback port to a store. cut
// closes every relayed connection and, until mend, closes each new one at
// once: the store is unreachable through it, as during a restart or a
// network fault, while it stays reachable directly. freeze instead keeps
// every connection open, and accepts new ones, but relays nothing until
// mend: the store accepts and never answers, as a hung server or a
// partition that drops packets.
//
// It also counts the round trips made through it (trips): on each relayed
// connection, a burst of bytes from the client followed by bytes from the
// store. Requests the client sends together (a pipeline, or several
// written before the first answer) count once, as does an answer the
// store sends in several parts; bytes the store sends unasked (a pub/sub
// message, a notification) count none.
type cutProxy struct {
	ln     net.Listener
	target string
	down   atomic.Bool
	trips  atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	thaw   chan struct{} // set by freeze, closed by mend: the relay waits for it
}

func newCutProxy(t testing.TB, target string) *cutProxy {
	t.Helper()
	if target == "" {
		t.Fatal("cutProxy: the kit has no store address")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = p.ln.Close()
		p.mend() // a frozen relay goes on, to find its connections closed
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

// cut makes the store unreachable through the proxy.
func (p *cutProxy) cut() {
	p.down.Store(true)
	p.closeAll()
}

// freeze makes the store hang through the proxy.
func (p *cutProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.thaw == nil {
		p.thaw = make(chan struct{})
	}
}

// mend makes it reachable again, and relays what a freeze held.
func (p *cutProxy) mend() {
	p.down.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.thaw != nil {
		close(p.thaw)
		p.thaw = nil
	}
}

// frozen is what a relay waits for before it passes bytes on: nil when
// the proxy is not frozen.
func (p *cutProxy) frozen() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.thaw
}

func (p *cutProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *cutProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		var asked atomic.Bool // the client sent bytes the store has not answered yet
		pipe := func(dst, src net.Conn, request bool) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					if thaw := p.frozen(); thaw != nil {
						<-thaw
					}
					if request {
						asked.Store(true)
					} else if asked.Swap(false) {
						p.trips.Add(1)
					}
					if _, werr := dst.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			_ = dst.Close()
			_ = src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(server, client, true) })
		p.wg.Go(func() { pipe(client, server, false) })
	}
}

// scriptedLeaves is a shared barrier whose Leave fails with a store fault
// for the entries in stuck, always, and for the others the first time
// only; it sends the entries it removed on removed, with the retry round
// of l it was removed in.
type scriptedLeaves struct {
	fencing.SharedBarrier // only Leave is called
	stuck                 map[string]bool
	l                     *leaver

	mu      sync.Mutex
	tried   map[string]int
	removed chan [2]any // entry ID, round
}

func (s *scriptedLeaves) Leave(_ context.Context, e fencing.BarrierEntry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tried[e.ID]++
	if s.stuck[e.ID] || s.tried[e.ID] == 1 {
		return fmt.Errorf("%w: scripted fault", fencing.ErrUnavailable)
	}
	s.removed <- [2]any{e.ID, s.l.rounds.Load()}
	return nil
}

// TestSharedBarrierLeaveRetriesPassStuckOnes: removals that keep failing
// (their part of the store still down) do not hold back the retries of a
// removal queued behind them, which may be on a part that is back: with
// more stuck ones ahead than a round tries, it is removed in the second
// round, not after one round per stuck removal.
func TestSharedBarrierLeaveRetriesPassStuckOnes(t *testing.T) {
	stuck := leaveFaultsPerRound + 2
	sb := &scriptedLeaves{stuck: map[string]bool{}, tried: map[string]int{}, removed: make(chan [2]any, 4)}
	l, err := newLeaver(sb, slog.New(slog.DiscardHandler), sdkmetric.NewMeterProvider().Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	sb.l = l
	defer func() { _ = l.close(context.Background()) }()
	until := time.Now().Add(time.Hour)
	for i := range stuck {
		id := fmt.Sprintf("stuck-%d", i)
		sb.mu.Lock() // the leaver's retries read stuck from the first queued removal on
		sb.stuck[id] = true
		sb.mu.Unlock()
		l.leave(fencing.BarrierEntry{Resource: "a", ID: id}, until)
		waitFor(t, "the stuck removal queued", func() bool {
			l.mu.Lock()
			defer l.mu.Unlock()
			return len(l.pending) == i+1
		})
	}
	l.leave(fencing.BarrierEntry{Resource: "b", ID: "behind"}, until)
	waitFor(t, "the removal behind them queued", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.pending) == stuck+1
	})
	// A round under way now may have started without it; the next one
	// tries leaveFaultsPerRound of those ahead of it, the one after it.
	queued := l.rounds.Load()
	select {
	case got := <-sb.removed:
		if got[0] != "behind" || got[1].(int64) > queued+2 {
			t.Fatalf("removed %v in round %v; want behind, by round %d (queued during round %d)", got[0], got[1], queued+2, queued)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the removal queued behind stuck ones was never retried")
	}
}

// TestSharedBarrierCloseHonoursContext: the store hangs (accepts and never
// answers) as a write ends, so the first attempt to remove its entry
// hangs; Close's context ends long before that attempt's own bound
// (leaveTimeout). Close returns ctx's error without waiting for that
// bound, the attempt has returned by then, its entry stays in the store
// (until its deadline) and the removal is counted as abandoned because the
// gate stopped, logged once.
func TestSharedBarrierCloseHonoursContext(t *testing.T) {
	t.Run("valkey", func(t *testing.T) {
		srv := valkeytest.Start(t)
		testCloseWithHungStore(t, valkeyKit(srv.URL(), []*valkeytest.Server{srv}), false)
	})
	t.Run("postgres", func(t *testing.T) { testCloseWithHungStore(t, postgresKit(t), false) })
}

// TestSharedBarrierCloseRemovesEntries: with a context that leaves time,
// Close waits for a first attempt still in flight (the store slow to
// answer it) and the entry is removed by the time Close returns.
func TestSharedBarrierCloseRemovesEntries(t *testing.T) {
	t.Run("valkey", func(t *testing.T) {
		srv := valkeytest.Start(t)
		testCloseWithHungStore(t, valkeyKit(srv.URL(), []*valkeytest.Server{srv}), true)
	})
	t.Run("postgres", func(t *testing.T) { testCloseWithHungStore(t, postgresKit(t), true) })
}

// testCloseWithHungStore freezes the store as a write ends, then closes
// the gate while the entry's first removal hangs: with a 200 ms context,
// or, with answer, with a long one, the store answering again once Close
// is under way.
func testCloseWithHungStore(t *testing.T, kit storeKit, answer bool) {
	ctx := context.Background()
	prefix := fmt.Sprintf("close%d", time.Now().UnixNano())
	const resource = "doc:close"
	cut := newCutProxy(t, kit.addr)
	var frozeAt atomic.Int64 // time.Now().UnixNano() when the store hung
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		frozeAt.Store(time.Now().UnixNano())
		cut.freeze() // the store hangs for the gate as the write ends
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	reader := sdkmetric.NewManualReader()
	var logs syncbuf.Buffer
	// The store's own timeouts are far beyond leaveTimeout: only the
	// attempt's bound, or Close's context, ends a hung removal.
	st := kit.via(t, prefix, cut.addr(), time.Minute)
	// Thawed at the end, before the store is closed (cleanups run last
	// first): a store client closing over a frozen connection waits on it.
	t.Cleanup(cut.mend)
	g, err := New(Options{Upstream: u, Store: st, ResourceHeader: true, SharedBarrier: st, GateID: "gate-a",
		BarrierTimeout: 20 * time.Second, BodyTimeout: 20 * time.Second, UpstreamTimeout: 20 * time.Second, TimeoutGrace: NoGrace,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	leaves := g.order.(*sharedOrder).leaves
	s := serveGate(t, g)
	lease, err := kit.open(t, prefix).Acquire(ctx, fencing.AcquireRequest{Resource: resource, Owner: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	r, err := doReq(http.DefaultClient, s.URL, "POST", "/w", "", HeaderResource, resource, HeaderToken, lease.Token.String())
	if err != nil || r.Status != http.StatusNoContent {
		t.Fatalf("write: %v %d %v", err, r.Status, r.Problem)
	}
	waitFor(t, "the first removal under way", func() bool { return leaves.attempts.Load() == 1 })
	s.Close()

	budget := 200 * time.Millisecond
	if answer {
		budget = time.Minute
	}
	cctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	closed := make(chan error, 1)
	go func() {
		_, err := g.Close(cctx)
		closed <- err
	}()
	if answer {
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while the removal was still in flight", err)
		case <-time.After(300 * time.Millisecond):
		}
		cut.mend()
	}
	select {
	case err = <-closed:
	case <-time.After(3 * leaveTimeout):
		t.Fatal("Close never returned")
	}
	entries := kit.gateEntries(t, prefix, resource, "gate-a")
	logged := strings.Count(logs.String(), "the gate stopped before the removal")
	if answer {
		// Close had time: every goroutine the leaver started has returned.
		if n := leaves.attempts.Load(); n != 0 {
			t.Errorf("%d first removals still running after Close", n)
		}
		if err != nil {
			t.Errorf("Close: %v, want nil", err)
		}
		if entries != 0 {
			t.Errorf("%d entries of gate A left after Close, want its ended write's removed", entries)
		}
		if n := sumInt(t, reader, MetricSharedLeavesAbandoned); n != 0 || logged != 0 {
			t.Errorf("%s = %d, logged %d times; want none", MetricSharedLeavesAbandoned, n, logged)
		}
		return
	}
	// The attempt began after the store hung: had Close waited for it
	// rather than cancel it, it would have returned no sooner than
	// leaveTimeout after the store hung.
	if took := time.Since(time.Unix(0, frozeAt.Load())); took >= leaveTimeout {
		t.Errorf("Close returned %v after the store hung: it waited for the removal's own bound (%v), not its 200 ms context", took, leaveTimeout)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close: %v, want its context's deadline", err)
	}
	if entries != 1 {
		t.Errorf("%d entries of gate A after Close, want the cut-off removal's 1, left until its deadline", entries)
	}
	// The cancelled attempt returns at once, or (a store client opening a
	// connection, which ignores cancellation) once the store answers
	// again; Close did not wait for it. Either it gave up, counted as
	// stopping, its entry left until its deadline, or the store took the
	// removal first.
	cut.mend()
	waitFor(t, "the cancelled removal returned", func() bool { return leaves.attempts.Load() == 0 })
	stopping := sumOutcome(t, reader, MetricSharedLeavesAbandoned, attrReason, "stopping")
	if left := kit.gateEntries(t, prefix, resource, "gate-a"); stopping+int64(1-left) != 1 || left > 1 {
		t.Errorf("%s{reason=stopping} = %d with %d entries left: want the removal either given up (1, 1 entry) or done (0, none)", MetricSharedLeavesAbandoned, stopping, left)
	}
	if logged != 1 {
		t.Errorf("the removals left at the stop logged %d times, want once:\n%s", logged, logs.String())
	}
}

// TestSharedWaitHistogramInSeconds: the shared barrier's wait histogram
// has bounds in seconds that tell a store round trip from a wait of
// seconds: a 0.2 s wait falls under 0.25, not into a first bucket of 5
// (the SDK's defaults, made for milliseconds).
func TestSharedWaitHistogramInSeconds(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	sb := &scriptedLeaves{stuck: map[string]bool{}, tried: map[string]int{}, removed: make(chan [2]any, 1)}
	o, err := newSharedOrder(sb, Options{GateID: "g", MeterProvider: mp}, slog.New(slog.DiscardHandler), time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = o.close(context.Background()) }()
	o.waitDur.Record(context.Background(), 0.2)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != MetricSharedWaitDuration {
				continue
			}
			dp := m.Data.(metricdata.Histogram[float64]).DataPoints[0]
			for i, b := range dp.Bounds {
				if dp.BucketCounts[i] > 0 {
					if i == 0 || dp.Bounds[i-1] >= 0.2 || b > 0.25 {
						t.Fatalf("a 0.2 s wait counted under %v (bounds %v), want under 0.25", b, dp.Bounds)
					}
					return
				}
			}
			t.Fatalf("a 0.2 s wait not counted under any bound (bounds %v)", dp.Bounds)
		}
	}
	t.Fatalf("no %s in the metrics", MetricSharedWaitDuration)
}
