package leaseapi_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/leaseapi"
)

// TestTelemetryUsesRoutePatterns checks the HTTP server metrics and spans:
// http.route is the chi pattern, never the raw path with the resource name
// in it, span names follow it, and an incoming traceparent is the parent.
func TestTelemetryUsesRoutePatterns(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	clock := newFakeClock()
	e := newEnvWith(t, clock, memstore.New(memstore.Options{Clock: clock}), func(o *leaseapi.Options) {
		o.MeterProvider = mp
		o.TracerProvider = tp
		o.ServerName = "127.0.0.1:7070"
	})

	wantOK(t, "acquire a", e.post("/v1/leases/job:1/acquire", `{"owner":"w"}`))
	wantOK(t, "acquire b", e.post("/v1/leases/job:2/acquire", `{"owner":"w"}`))
	wantOK(t, "status", e.get("/v1/leases/job:1"))
	e.get("/livez")
	if a := e.get("/nope"); a.status != 404 {
		t.Fatalf("unknown path: %d", a.status)
	}
	// A caller's trace context is honoured.
	parent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	e.req("GET", "/v1/leases/job:2", "", "", "Traceparent", parent)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "http.server.request.duration" {
				continue
			}
			if m.Unit != "s" {
				t.Errorf("unit %q", m.Unit)
			}
			for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				route, _ := dp.Attributes.Value("http.route")
				method, _ := dp.Attributes.Value("http.request.method")
				status, _ := dp.Attributes.Value("http.response.status_code")
				addr, _ := dp.Attributes.Value("server.address")
				port, _ := dp.Attributes.Value("server.port")
				if addr.AsString() != "127.0.0.1" || port.AsInt64() != 7070 {
					t.Errorf("server %q:%d, want the configured 127.0.0.1:7070", addr.AsString(), port.AsInt64())
				}
				lines = append(lines, fmt.Sprintf("%s %s %d =%d", method.AsString(), route.AsString(), status.AsInt64(), dp.Count))
			}
		}
	}
	sort.Strings(lines)
	want := strings.Join([]string{
		"GET  404 =1",
		"GET /livez 200 =1",
		"GET /v1/leases/{resource} 200 =2",
		"POST /v1/leases/{resource}/acquire 200 =2",
	}, "\n")
	if got := strings.Join(lines, "\n"); got != want {
		t.Fatalf("http.server.request.duration series\n got:\n%s\nwant:\n%s", got, want)
	}

	var names []string
	for _, sp := range spans.Ended() {
		names = append(names, sp.Name())
	}
	want = "POST /v1/leases/{resource}/acquire,POST /v1/leases/{resource}/acquire,GET /v1/leases/{resource},GET /livez,GET,GET /v1/leases/{resource}"
	if got := strings.Join(names, ","); got != want {
		t.Fatalf("span names\n got %s\nwant %s", got, want)
	}
	last := spans.Ended()[len(names)-1]
	if p := last.Parent(); !p.IsRemote() || p.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || p.SpanID().String() != "b7ad6b7169203331" {
		t.Fatalf("the request with a traceparent has parent %v, want the caller's span", p)
	}
	if first := spans.Ended()[0]; first.Parent().IsValid() {
		t.Fatalf("a request without traceparent has parent %v", first.Parent())
	}
}
