package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencegate/fencegate/fencing/memstore"
)

// collect returns the named metric from the reader.
func collect(t *testing.T, r *sdkmetric.ManualReader, name string) (metricdata.Metrics, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// writeCounts renders MetricWrites as sorted "code method=n" lines.
func writeCounts(t *testing.T, r *sdkmetric.ManualReader) string {
	t.Helper()
	m, ok := collect(t, r, MetricWrites)
	if !ok {
		return ""
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok || !sum.IsMonotonic {
		t.Fatalf("%s is %T (monotonic %v), want a monotonic int64 sum", MetricWrites, m.Data, sum.IsMonotonic)
	}
	var lines []string
	for _, dp := range sum.DataPoints {
		code, _ := dp.Attributes.Value("code")
		method, _ := dp.Attributes.Value("method")
		lines = append(lines, fmt.Sprintf("%s %s=%d", code.AsString(), method.AsString(), dp.Value))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestWriteCounter sends a known sequence of requests and checks that each
// write is counted once, by its final outcome, and reads not at all.
func TestWriteCounter(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	e := newEnv(t, testRules, func(o *Options) {
		o.MeterProvider = mp
		o.TracerProvider = tp
		o.ServerName = "127.0.0.1:8080"
		// Long enough for every answered write on a busy machine (50 ms
		// timed out an ordinary write once in a full run); the one slow
		// write below waits it out.
		o.UpstreamTimeout = time.Second
		o.BarrierTimeout = 20 * time.Millisecond
		o.TimeoutGrace = time.Hour
	})
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		if rec.Body == "slow" {
			<-r.Context().Done()
			return true
		}
		return false
	}
	if got := writeCounts(t, reader); got != "" {
		t.Fatalf("counter before any write: %q", got)
	}

	a := e.acquire("job:1", "alice", 10*time.Second)
	if r := e.do("PUT", "/jobs/1", "a1", HeaderToken, tok(a.Token)); r.Status != 200 {
		t.Fatalf("admitted write: %d %s", r.Status, r.Body)
	}
	if r := e.do("DELETE", "/jobs/1", "", HeaderToken, tok(a.Token)); r.Status != 200 {
		t.Fatalf("admitted delete: %d %s", r.Status, r.Body)
	}
	e.clock.Advance(11 * time.Second)
	b := e.acquire("job:1", "bob", 10*time.Second)
	if r := e.do("PUT", "/jobs/1", "b1", HeaderToken, tok(b.Token)); r.Status != 200 {
		t.Fatalf("bob's write: %d %s", r.Status, r.Body)
	}
	wantProblem(t, e.do("PUT", "/jobs/1", "a2", HeaderToken, tok(a.Token)), 409, "stale-token")
	wantProblem(t, e.do("PUT", "/jobs/1", "x", HeaderToken, "99"), 409, "token-not-issued")
	wantProblem(t, e.do("PUT", "/jobs/1", "x"), 428, "token-required")
	wantProblem(t, e.do("PURGE", "/jobs/1", "x"), 428, "token-required")
	wantProblem(t, e.do("DELETE", "/admin/x", ""), 403, "write-denied")
	if r := e.do("POST", "/health", "ping"); r.Status != 200 {
		t.Fatalf("pass rule: %d", r.Status)
	}
	if r := e.do("GET", "/jobs/1", ""); r.Status != 200 {
		t.Fatalf("read: %d", r.Status)
	}
	// job:2: an upstream timeout, then a higher token held at the barrier.
	c := e.acquire("job:2", "carol", 10*time.Second)
	e.clock.Advance(11 * time.Second)
	d := e.acquire("job:2", "dave", 10*time.Second)
	wantProblem(t, e.do("PUT", "/jobs/2", "slow", HeaderToken, tok(c.Token)), 504, "upstream-timeout")
	wantProblem(t, e.do("PUT", "/jobs/2", "d1", HeaderToken, tok(d.Token)), 503, "barrier-timeout")
	// The store fails: fail closed.
	_ = e.store.Close()
	wantProblem(t, e.do("PUT", "/jobs/1", "b2", HeaderToken, tok(b.Token)), 503, "store-unavailable")

	want := strings.Join([]string{
		"admitted DELETE=1",
		"admitted PUT=2",
		"barrier-timeout PUT=1",
		"stale-token PUT=1",
		"store-unavailable PUT=1",
		"token-not-issued PUT=1",
		"token-required PUT=1",
		"token-required _OTHER=1",
		"unfenced POST=1",
		"upstream-timeout PUT=1",
		"write-denied DELETE=1",
	}, "\n")
	if got := writeCounts(t, reader); got != want {
		t.Fatalf("fencegate.gate.writes\n got:\n%s\nwant:\n%s", got, want)
	}

	// HTTP server metrics: one duration sample per request, with the rule
	// pattern as http.route and the configured server address. 13 requests:
	// 9 matched /jobs/{id}; PURGE (no rule for it) and GET have no route.
	m, ok := collect(t, reader, "http.server.request.duration")
	if !ok {
		t.Fatal("no http.server.request.duration")
	}
	routes := map[string]uint64{}
	var total uint64
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		route, _ := dp.Attributes.Value("http.route")
		routes[route.AsString()] += dp.Count
		total += dp.Count
		if addr, _ := dp.Attributes.Value("server.address"); addr.AsString() != "127.0.0.1" {
			t.Errorf("server.address %q, want the configured 127.0.0.1", addr.AsString())
		}
	}
	if total != 13 || routes["/jobs/{id}"] != 9 || routes["/health"] != 1 || routes["/admin/{rest...}"] != 1 || routes[""] != 2 {
		t.Fatalf("request durations by route: %v (total %d)", routes, total)
	}

	// Spans: named after the rule, carrying resource, token and outcome.
	var found bool
	for _, sp := range spans.Ended() {
		attrs := attribute.NewSet(sp.Attributes()...)
		if code, _ := attrs.Value(attrCode); code.AsString() != "stale-token" {
			continue
		}
		found = true
		res, _ := attrs.Value(attrResource)
		tk, _ := attrs.Value(attrToken)
		if sp.Name() != "PUT /jobs/{id}" || res.AsString() != "job:1" || tk.AsInt64() != int64(a.Token) {
			t.Fatalf("stale write span %q resource %q token %d", sp.Name(), res.AsString(), tk.AsInt64())
		}
	}
	if !found {
		t.Fatal("no span with the stale-token outcome")
	}
}

// TestSpanNameWithoutRule: a write routed by header and a read are named
// "{method} gate".
func TestSpanNameWithoutRule(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	e := newEnv(t, testRules, func(o *Options) { o.TracerProvider = tp })
	l := e.acquire("acct:1", "a", 10*time.Second)
	if r := e.do("POST", "/accounts/1", "x", HeaderToken, tok(l.Token), HeaderResource, "acct:1"); r.Status != 200 {
		t.Fatalf("write: %d", r.Status)
	}
	if r := e.do("GET", "/accounts/1", ""); r.Status != 200 {
		t.Fatalf("read: %d", r.Status)
	}
	var names []string
	for _, sp := range spans.Ended() {
		names = append(names, sp.Name())
	}
	if strings.Join(names, ",") != "POST gate,GET gate" {
		t.Fatalf("span names %v", names)
	}
}

// TestTelemetryAllocatesNothing: once a series exists, counting a write
// and recording a request's duration allocate nothing.
func TestTelemetryAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	e := newEnv(t, testRules, func(o *Options) { o.MeterProvider = mp; o.ServerName = "127.0.0.1:8080" })
	x := &exchange{c: &loopRequest{status: http.StatusOK}, ctx: context.Background(), start: time.Now(), method: http.MethodPut, route: "/jobs/{id}"}
	e.gate.count(x, CodeAdmitted) // creates the series
	e.gate.end(x)
	if n := testing.AllocsPerRun(100, func() {
		e.gate.count(x, CodeAdmitted)
		e.gate.end(x)
	}); n != 0 {
		t.Fatalf("%v allocations per write", n)
	}
}

// TestWriteCounterUnknownCode: a code missing from writeCodes is counted
// too (its counter made on first use), and only counted pairs are
// reported.
func TestWriteCounterUnknownCode(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	up, _ := url.Parse("http://127.0.0.1:1")
	g, err := New(Options{Upstream: up, Store: memstore.New(memstore.Options{}),
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	g.tel.writes.add(writeKey{"made-up", http.MethodPut})
	g.tel.writes.add(writeKey{"made-up", http.MethodPut})
	g.tel.writes.add(writeKey{CodeAdmitted, http.MethodPost})
	if got, want := writeCounts(t, reader), "admitted POST=1\nmade-up PUT=2"; got != want {
		t.Fatalf("writes:\n%s\nwant:\n%s", got, want)
	}
}
