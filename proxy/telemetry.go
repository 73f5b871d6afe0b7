package proxy

import (
	"context"
	"fmt"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the gate's meter and tracer.
const ScopeName = "github.com/fencegate/fencegate/proxy"

// MetricWrites is the counter of unsafe requests (writes) through the gate,
// exported to Prometheus as fencegate_gate_writes_total. Each write is
// counted exactly once, when its outcome is final, with two attributes:
//
//   - code: CodeAdmitted (admitted, forwarded, and the upstream answered,
//     whatever its status), CodeUnfenced (a pass rule let it through
//     unchecked), CodeClientGone, or the problem code it was refused or
//     failed with: token-required, invalid-token, resource-required,
//     write-denied, stale-token, token-not-issued, lease-not-held,
//     store-unavailable, barrier-timeout, gate-stopping, body-timeout,
//     invalid-body, upstream-timeout, upstream-unavailable, internal-error,
//     path-not-canonical, upgrade-denied, method-override-denied.
//   - method: POST, PUT, PATCH, DELETE, or _OTHER for any other unsafe
//     method (kept out of the attribute so clients cannot create series).
//
// Safe requests (GET, HEAD, OPTIONS, TRACE) are reads: they are not counted
// here, only in the HTTP server metrics.
const MetricWrites = "fencegate.gate.writes"

// Outcome codes of MetricWrites that are not problem codes.
const (
	// CodeAdmitted: the store admitted the write, the gate forwarded it
	// and the upstream's response headers came back.
	CodeAdmitted = "admitted"
	// CodeUnfenced: a pass rule forwarded the write without a check.
	CodeUnfenced = "unfenced"
	// CodeClientGone: the client left before the write's outcome was
	// known; nothing was answered. If it left while the write was being
	// forwarded, the upstream may have applied it.
	CodeClientGone = "client-gone"
)

// Span attribute keys set on the gate's server span for fenced writes.
var (
	attrResource = attribute.Key("fencegate.resource")
	attrToken    = attribute.Key("fencegate.token")
	attrCode     = attribute.Key("fencegate.gate.code")
)

// writeCodes are the outcome codes count can report (those MetricWrites
// lists, plus invalid-request, which problem.From gives a store's
// validation error), and writeMethods the values of its method attribute.
var (
	writeCodes = []string{CodeAdmitted, CodeUnfenced, CodeClientGone,
		"token-required", "invalid-token", "resource-required", "write-denied",
		"stale-token", "token-not-issued", "lease-not-held", "store-unavailable",
		"barrier-timeout", "gate-stopping", "body-timeout", "invalid-body",
		"upstream-timeout", "upstream-unavailable",
		"internal-error", "invalid-request", "path-not-canonical", "upgrade-denied",
		"method-override-denied"}
	writeMethods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, "_OTHER"}
)

// writeKey is a (code, method) pair of MetricWrites.
type writeKey struct{ code, method string }

// writeAttrs is the measurement option of one (code, method) pair, as the
// variadic slice Add takes.
func writeAttrs(k writeKey) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
		attribute.String("code", k.code), attribute.String("method", k.method)))}
}

// instrument creates the counter and wraps serve with otelhttp when a
// provider is set; with neither, requests go straight to serve.
func (g *Gate) instrument(opts Options) error {
	g.handler = http.HandlerFunc(g.serve)
	// Every attribute set count can use, built once: a write then counts
	// without sorting or allocating one.
	g.writeOpts = make(map[writeKey][]metric.AddOption, len(writeCodes)*len(writeMethods))
	for _, c := range writeCodes {
		for _, m := range writeMethods {
			k := writeKey{c, m}
			g.writeOpts[k] = writeAttrs(k)
		}
	}
	mp, tp := opts.MeterProvider, opts.TracerProvider
	if mp == nil && tp == nil {
		g.writes, _ = metricnoop.Meter{}.Int64Counter(MetricWrites)
		return nil
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	c, err := mp.Meter(ScopeName).Int64Counter(MetricWrites,
		metric.WithUnit("{write}"),
		metric.WithDescription("Unsafe requests through the write gate, by final outcome code and method."))
	if err != nil {
		return fmt.Errorf("proxy: creating %s: %w", MetricWrites, err)
	}
	g.writes = c
	hopts := []otelhttp.Option{
		otelhttp.WithMeterProvider(mp),
		otelhttp.WithTracerProvider(tp),
		// Explicit, so the gate never reads the global propagator.
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(spanName),
	}
	if opts.ServerName != "" {
		hopts = append(hopts, otelhttp.WithServerName(opts.ServerName))
	}
	g.handler = otelhttp.NewHandler(g.handler, "gate", hopts...)
	return nil
}

// spanName is "{method} {rule pattern}", or "{method} gate" when no rule
// matched (safe requests and writes routed by header). Methods outside the
// standard set are named HTTP, as the semantic conventions ask.
func spanName(_ string, r *http.Request) string {
	m := r.Method
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodTrace, http.MethodConnect:
	default:
		m = "HTTP"
	}
	if r.Pattern != "" {
		return m + " " + r.Pattern
	}
	return m + " gate"
}

// count records one write's final outcome on the counter and the span.
func (g *Gate) count(r *http.Request, code string) {
	ctx := r.Context()
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attrCode.String(code))
	}
	if safeMethod(r.Method) {
		return // a read refused (an upgrade): not a write
	}
	k := writeKey{code, writeMethod(r.Method)}
	opts, ok := g.writeOpts[k]
	if !ok {
		opts = writeAttrs(k) // a code missing from writeCodes
	}
	// WithoutCancel: a write whose client left is counted all the same.
	g.writes.Add(context.WithoutCancel(ctx), 1, opts...)
	g.auditEnd(r, code)
}

// writeMethod bounds the method attribute of MetricWrites.
func writeMethod(m string) string {
	switch m {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return m
	}
	return "_OTHER"
}
