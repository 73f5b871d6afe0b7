package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// scrape GETs /metrics from the API listener with no credentials and
// returns the Prometheus text.
func scrape(t *testing.T, p *proc) string {
	t.Helper()
	resp, err := http.Get(p.url("api", "/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	return string(body)
}

// sample returns the value of the first sample whose line starts with name
// and contains every label given, or -1 when there is none.
func sample(text, name string, labels ...string) float64 {
next:
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return -1
		}
		return v
	}
	return -1
}

// TestMetricsThroughTheBinary: an acquire, an admitted write and a stale
// write, then /metrics (open although the API needs a token) shows the
// write counter by code, the store latency histogram and the HTTP server
// metrics with route patterns.
func TestMetricsThroughTheBinary(t *testing.T) {
	rec := &recorder{}
	upstream := httptest.NewServer(rec)
	defer upstream.Close()
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:",
		"FENCEGATE_API_TOKEN=s3cret",
		"FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}",
	}, "api", "gate")
	auth := map[string]string{"Authorization": "Bearer s3cret"}

	st, a, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), auth, `{"owner":"a","ttl_seconds":1}`)
	if st != 200 {
		t.Fatalf("acquire a: %d %v", st, a)
	}
	tokA := strconv.FormatInt(token(t, a), 10)
	if st, _, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": tokA}, `{"v":1}`); st != 200 {
		t.Fatalf("a's write: %d", st)
	}
	// b takes over after a's lease expires; a's late write is stale.
	var b map[string]any
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, b, _ = call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), auth, `{"owner":"b","wait_seconds":5}`)
		if st == 200 || time.Now().After(deadline) {
			break
		}
	}
	if st != 200 {
		t.Fatalf("acquire b: %d %v", st, b)
	}
	tokB := strconv.FormatInt(token(t, b), 10)
	if st, _, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": tokB}, `{"v":2}`); st != 200 {
		t.Fatalf("b's write: %d", st)
	}
	if st, m, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": tokA}, `{"v":3}`); st != 409 || m["code"] != "stale-token" {
		t.Fatalf("a's late write: %d %v", st, m)
	}
	// An unauthenticated /v1 call is still refused: only /metrics is open.
	if st, _, _ := call(t, "GET", p.url("api", "/v1/leases/job:1"), nil, ""); st != 401 {
		t.Fatalf("/v1 without a token: %d", st)
	}

	text := scrape(t, p)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64 // -1: any value present
	}{
		{"fencegate_gate_writes_total", []string{`code="admitted"`, `method="PUT"`}, 2},
		{"fencegate_gate_writes_total", []string{`code="stale-token"`, `method="PUT"`}, 1},
		{"fencegate_store_duration_seconds_count", []string{`operation="admit"`, `outcome="ok"`}, 2},
		{"fencegate_store_duration_seconds_count", []string{`operation="admit"`, `outcome="stale-token"`}, 1},
		{"fencegate_store_duration_seconds_bucket", []string{`operation="admit"`, `outcome="ok"`, `le="+Inf"`}, 2},
		{"fencegate_store_duration_seconds_count", []string{`operation="acquire"`, `outcome="ok"`}, -1},
		{"http_server_request_duration_seconds_count", []string{`http_route="/v1/leases/{resource}/acquire"`, `http_response_status_code="200"`}, -1},
		{"http_server_request_duration_seconds_count", []string{`http_route="/jobs/{id}"`, `http_response_status_code="409"`}, 1},
		{"go_goroutines", nil, -1},
		{"fencegate_connections", []string{`listener="api"`}, -1},
		{"fencegate_connections", []string{`listener="gate"`}, -1},
		{"fencegate_gate_writes_in_flight", nil, 0},
	} {
		got := sample(text, c.name, c.labels...)
		if got < 0 || (c.want >= 0 && got != c.want) {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// No instrumentation-scope labels on every series.
	if strings.Contains(text, "otel_scope_") {
		t.Errorf("/metrics carries otel_scope_* labels")
	}
	if api := sample(text, "fencegate_connections", `listener="api"`); api < 1 {
		t.Errorf("fencegate_connections{listener=\"api\"} = %v during a scrape on it, want at least 1", api)
	}
	// Resource names never become labels.
	if strings.Contains(text, "job:1") || strings.Contains(text, "/jobs/1") {
		t.Errorf("a resource name or raw path appears in /metrics")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}
	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.logs)
	}
}

// collector is a stand-in OTLP/HTTP receiver that keeps every request body
// by path.
type collector struct {
	mu     sync.Mutex
	bodies map[string][]byte
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	if c.bodies == nil {
		c.bodies = map[string][]byte{}
	}
	if r.Header.Get("Content-Type") == "application/x-protobuf" {
		c.bodies[r.URL.Path] = append(c.bodies[r.URL.Path], body...)
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

func (c *collector) body(path string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.bodies[path]...)
}

// TestOTLPExportThroughTheBinary: with OTEL_EXPORTER_OTLP_ENDPOINT set,
// spans and metrics reach the collector by OTLP/HTTP, flushed at the
// latest on shutdown.
func TestOTLPExportThroughTheBinary(t *testing.T) {
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL,
		"OTEL_SERVICE_NAME=fencegate-otlp-test",
	}, "api")
	if st, m, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"a"}`); st != 200 {
		t.Fatalf("acquire: %d %v", st, m)
	}
	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.logs)
	}
	traces, metrics := col.body("/v1/traces"), col.body("/v1/metrics")
	for _, want := range []string{"fencegate-otlp-test", "store acquire", "POST /v1/leases/{resource}/acquire"} {
		if !bytes.Contains(traces, []byte(want)) {
			t.Errorf("exported spans lack %q (%d bytes received)", want, len(traces))
		}
	}
	for _, want := range []string{"fencegate-otlp-test", "fencegate.store.duration", "http.server.request.duration"} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("exported metrics lack %q (%d bytes received)", want, len(metrics))
		}
	}
	if strings.Contains(p.logs.String(), "telemetry export failed") {
		t.Errorf("export errors logged:\n%s", p.logs)
	}
}
