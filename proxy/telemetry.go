package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/fencegate/fencegate/internal/atomichist"
)

// ScopeName is the instrumentation scope of the gate's meter and tracer.
const ScopeName = "github.com/fencegate/fencegate/proxy"

// MetricWrites is the counter of unsafe requests (writes) through the gate,
// exported to Prometheus as fencegate_gate_writes_total. Each write is
// counted exactly once, when its outcome is final, with two attributes:
//
//   - code: CodeAdmitted (admitted, forwarded, and the upstream answered,
//     whatever its status), CodeUnfenced (a pass rule let it through
//     unchecked), or the problem code it was refused or
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
	// known. The gate does not watch idle client connections, so it does
	// not count writes with it (a client that leaves is noticed when its
	// answer cannot be sent); the shared barrier's wait metric may, and
	// the code stays listed so dashboards keep their series.
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

// writeCounter counts MetricWrites per (code, method) in atomic counters,
// which the meter reads through an observable counter when it collects: a
// write costs a map lookup and an atomic add, not an SDK measurement (about
// 1 µs on the event loop, measured). A pair is reported once it has been
// counted, as a synchronous counter would report it.
type writeCounter struct {
	mu     sync.RWMutex
	counts map[writeKey]*writeCount
}

// writeCount is one (code, method) pair's count and attribute set.
type writeCount struct {
	n     atomic.Int64
	attrs metric.ObserveOption
}

// newWriteCounter has a counter ready for each pair of writeCodes and
// writeMethods; add makes one for any other code.
func newWriteCounter() *writeCounter {
	w := &writeCounter{counts: make(map[writeKey]*writeCount, len(writeCodes)*len(writeMethods))}
	for _, c := range writeCodes {
		for _, m := range writeMethods {
			w.make(writeKey{c, m})
		}
	}
	return w
}

// make adds k's counter; w.mu is held for writing, or w is not shared yet.
func (w *writeCounter) make(k writeKey) *writeCount {
	n := &writeCount{attrs: metric.WithAttributeSet(attribute.NewSet(
		attribute.String("code", k.code), attribute.String("method", k.method)))}
	w.counts[k] = n
	return n
}

// add counts one write for k.
func (w *writeCounter) add(k writeKey) {
	w.mu.RLock()
	n := w.counts[k]
	w.mu.RUnlock()
	if n == nil { // a code missing from writeCodes
		w.mu.Lock()
		if n = w.counts[k]; n == nil {
			n = w.make(k)
		}
		w.mu.Unlock()
	}
	n.n.Add(1)
}

// observe reports every pair counted so far (the observable counter's
// callback).
func (w *writeCounter) observe(_ context.Context, o metric.Int64Observer) error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	for _, n := range w.counts {
		if v := n.n.Load(); v > 0 {
			o.Observe(v, n.attrs)
		}
	}
	return nil
}

// durationKey is the attribute set of one http.server.request.duration
// series, besides the server's own.
type durationKey struct {
	method string // a standard method, or _OTHER
	status int
	route  string
}

// telemetry is the gate's instruments. With no providers set, it records
// nothing and starts no spans.
type telemetry struct {
	writes    *writeCounter        // MetricWrites, observed by the meter
	panics    atomic.Int64         // MetricPanics, observed by the meter
	duration  *atomichist.Float64  // nil without a meter provider
	server    []attribute.KeyValue // server.address, server.port, ...
	mu        sync.RWMutex
	durSeries map[durationKey]atomichist.Series
	tracer    trace.Tracer // nil without a tracer provider
}

// init creates the instruments. Every attribute set a measurement uses is
// built once (the write counter's here, a duration series' the first time
// it is seen), so recording allocates nothing.
func (t *telemetry) init(opts Options) error {
	t.writes = newWriteCounter()
	t.durSeries = make(map[durationKey]atomichist.Series)
	if tp := opts.TracerProvider; tp != nil {
		if _, noop := tp.(tracenoop.TracerProvider); !noop { // a no-op one: no span work per request
			t.tracer = tp.Tracer(ScopeName)
		}
	}
	mp := opts.MeterProvider
	if mp == nil {
		return nil
	}
	meter := mp.Meter(ScopeName)
	var err error
	if _, err = meter.Int64ObservableCounter(MetricWrites,
		metric.WithUnit("{write}"),
		metric.WithDescription("Unsafe requests through the write gate, by final outcome code and method."),
		metric.WithInt64Callback(t.writes.observe)); err != nil {
		return fmt.Errorf("proxy: creating %s: %w", MetricWrites, err)
	}
	if _, err = meter.Int64ObservableCounter(MetricPanics,
		metric.WithUnit("{panic}"),
		metric.WithDescription("Panics the gate's event loops contained: each closed the connections its step touched."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(t.panics.Load())
			return nil
		})); err != nil {
		return fmt.Errorf("proxy: creating %s: %w", MetricPanics, err)
	}
	if t.duration, err = atomichist.NewFloat64(mp, ScopeName, MetricRequestDuration, "s", "Duration of HTTP server requests.",
		[]float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}); err != nil {
		return fmt.Errorf("proxy: creating %s: %w", MetricRequestDuration, err)
	}
	t.server = []attribute.KeyValue{attribute.String("url.scheme", "http"),
		attribute.String("network.protocol.name", "http"), attribute.String("network.protocol.version", "1.1")}
	if opts.ServerName != "" {
		host, port, err := net.SplitHostPort(opts.ServerName)
		if err != nil {
			host = opts.ServerName
		}
		t.server = append(t.server, attribute.String("server.address", host))
		if p, err := strconv.Atoi(port); err == nil {
			t.server = append(t.server, attribute.Int("server.port", p))
		}
	}
	return nil
}

// MetricPanics counts the panics the gate's event loops contained,
// exported to Prometheus as fencegate_gate_panics_total. A panic in a
// loop's step closes the connections that step touched and logs its cause
// with their request ids; one opening a loop's mark reader fails that
// open (loopguard_linux.go); the process, the lease API and every other
// connection go on serving. Any increase is a defect worth reporting.
const MetricPanics = "fencegate.gate.panics"

// MetricRequestDuration is the HTTP semantic conventions' server request
// duration, in seconds, exported to Prometheus as
// http_server_request_duration_seconds, with http.request.method,
// http.response.status_code, http.route (the matching rule's pattern, when
// one matched), url.scheme, network.protocol.* and, with
// Options.ServerName, server.address and server.port. It measures until
// the response headers are ready; a streamed body is relayed after.
const MetricRequestDuration = "http.server.request.duration"

// durationSeries is one duration series.
func (t *telemetry) durationSeries(k durationKey) atomichist.Series {
	t.mu.RLock()
	o, ok := t.durSeries[k]
	t.mu.RUnlock()
	if ok {
		return o
	}
	kvs := append(slices.Clip(t.server), attribute.String("http.request.method", k.method),
		attribute.Int("http.response.status_code", k.status))
	if k.route != "" {
		kvs = append(kvs, attribute.String("http.route", k.route))
	}
	o = t.duration.Series(attribute.NewSet(kvs...))
	t.mu.Lock()
	t.durSeries[k] = o
	t.mu.Unlock()
	return o
}

// begin starts x's telemetry and, for a write, its audit record: a server
// span (with a tracer provider), named "{method} {rule pattern}" or
// "{method} gate", the child of the client's W3C traceparent if any.
func (g *Gate) begin(x *exchange) {
	if !safeMethod(x.method) {
		g.openAudit(x)
	}
	if g.tel.tracer == nil {
		return
	}
	var carrier propagation.TextMapCarrier
	if x.c != nil {
		carrier = headerCarrier{x.c}
	} else {
		carrier = propagation.HeaderCarrier(x.r.Header)
	}
	ctx := propagation.TraceContext{}.Extract(x.ctx, carrier)
	x.ctx, x.span = g.tel.tracer.Start(ctx, spanName(x.method, x.route), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(x.start))
	if x.span.IsRecording() {
		x.span.SetAttributes(attribute.String("http.request.method", stdMethod(x.method)),
			attribute.String("url.path", x.path), attribute.String("http.route", x.route))
	}
}

// end records x's duration, ends its span and its audit registration.
func (g *Gate) end(x *exchange) {
	var status int
	if x.c != nil {
		status = x.c.status
	} else {
		status = x.w.status
	}
	if g.tel.duration != nil {
		g.tel.durationSeries(durationKey{stdMethod(x.method), status, x.route}).Record(time.Since(x.start).Seconds())
	}
	if x.span != nil {
		if x.span.IsRecording() {
			x.span.SetAttributes(attribute.Int("http.response.status_code", status))
			if status >= 500 {
				x.span.SetStatus(codes.Error, "")
			}
		}
		x.span.End()
	}
	if x.audit == nil {
		g.accessEnd(x, status)
	}
	g.closeAudit(x)
}

// MetricConnections is the gauge of open client connections, exported to
// Prometheus as fencegate_connections, with the attribute listener: "gate"
// or "api". Each listener registers its own (ObserveConnections).
const MetricConnections = "fencegate.connections"

// MetricWritesInFlight is the gauge of writes in the gate whose outcome is
// not final yet (Gate.InFlight), exported to Prometheus as
// fencegate_gate_writes_in_flight.
const MetricWritesInFlight = "fencegate.gate.writes_in_flight"

// MetricConnectionsRefused is the counter of client connections refused
// under the connection caps (answered 503 too-many-connections, or closed
// on a TLS listener), exported to Prometheus as
// fencegate_connections_refused_total, with the attributes listener
// ("gate" or "api") and reason: "total" (beyond FENCEGATE_MAX_CONNS and
// its reserve) or "per-client" (beyond FENCEGATE_MAX_CONNS_PER_CLIENT).
const MetricConnectionsRefused = "fencegate.connections.refused"

// ConnCount is one listener's connection counts for ObserveConnections,
// read at each collection: Active its open connections, Refused the
// connections refused so far by reason (a connlimit.Counter's Active and
// Refused, the gate server's ActiveConnections and RefusedConnections).
type ConnCount struct {
	Listener string // "gate" or "api"
	Active   func() int64
	Refused  func() (total, perClient int64) // nil: not observed
}

// ObserveConnections registers MetricConnections and
// MetricConnectionsRefused, once for every listener (an instrument takes
// its callbacks when it is created). It records nothing per connection.
func ObserveConnections(mp metric.MeterProvider, listeners ...ConnCount) error {
	if mp == nil || len(listeners) == 0 {
		return nil
	}
	sets := make([]metric.ObserveOption, len(listeners))
	refusedSets := make([][2]metric.ObserveOption, len(listeners))
	for i, l := range listeners {
		sets[i] = metric.WithAttributeSet(attribute.NewSet(attribute.String("listener", l.Listener)))
		for j, reason := range []string{"total", "per-client"} {
			refusedSets[i][j] = metric.WithAttributeSet(attribute.NewSet(
				attribute.String("listener", l.Listener), attribute.String("reason", reason)))
		}
	}
	_, err := mp.Meter(ScopeName).Int64ObservableCounter(MetricConnectionsRefused,
		metric.WithUnit("{connection}"),
		metric.WithDescription("Client connections refused under the connection caps, by listener and reason (total: FENCEGATE_MAX_CONNS; per-client: FENCEGATE_MAX_CONNS_PER_CLIENT)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for i, l := range listeners {
				if l.Refused == nil {
					continue
				}
				total, perClient := l.Refused()
				o.Observe(total, refusedSets[i][0])
				o.Observe(perClient, refusedSets[i][1])
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("proxy: creating %s: %w", MetricConnectionsRefused, err)
	}
	_, err = mp.Meter(ScopeName).Int64ObservableGauge(MetricConnections,
		metric.WithUnit("{connection}"),
		metric.WithDescription("Open client connections, by listener."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for i, l := range listeners {
				o.Observe(l.Active(), sets[i])
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("proxy: creating %s: %w", MetricConnections, err)
	}
	return nil
}

// ObserveWritesInFlight registers MetricWritesInFlight for g.
func ObserveWritesInFlight(mp metric.MeterProvider, g *Gate) error {
	if mp == nil {
		return nil
	}
	_, err := mp.Meter(ScopeName).Int64ObservableGauge(MetricWritesInFlight,
		metric.WithUnit("{write}"),
		metric.WithDescription("Writes in the gate whose outcome is not final yet: waiting for the store or the barrier, or forwarded and not answered."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(g.InFlight())
			return nil
		}))
	if err != nil {
		return fmt.Errorf("proxy: creating %s: %w", MetricWritesInFlight, err)
	}
	return nil
}

// ActiveConnections is the number of client connections the server holds
// open (its connection cap's count), for ObserveConnections.
func (s *Server) ActiveConnections() int64 { return s.limit.Active() }

// RefusedConnections is the number of client connections the server has
// refused under its caps, by reason (see connlimit.Counter.Refused), for
// ObserveConnections.
func (s *Server) RefusedConnections() (total, perClient int64) { return s.limit.Refused() }

// headerCarrier reads W3C trace context from the event loops' request
// header (the gate only extracts it).
type headerCarrier struct{ r *loopRequest }

func (c headerCarrier) Get(key string) string {
	return string(c.r.value(textproto.CanonicalMIMEHeaderKey(key)))
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	var keys []string
	for k := range c.r.fields() {
		keys = append(keys, string(k))
	}
	return keys
}

// stdMethod is m if it is a standard method, otherwise _OTHER (the
// semantic conventions' bound on the method attribute).
func stdMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodTrace, http.MethodConnect:
		return m
	}
	return "_OTHER"
}

// spanName is "{method} {rule pattern}", or "{method} gate" when no rule
// matched (safe requests and writes routed by header). Methods outside the
// standard set are named HTTP, as the semantic conventions ask.
func spanName(method, route string) string {
	m := stdMethod(method)
	if m == "_OTHER" {
		m = "HTTP"
	}
	if route != "" {
		return m + " " + route
	}
	return m + " gate"
}

// count records one write's final outcome on the counter, the span and
// the audit log. Reads (a refused upgrade) are not counted.
func (g *Gate) count(x *exchange, code string) {
	if x.span != nil && x.span.IsRecording() {
		x.span.SetAttributes(attrCode.String(code))
	}
	if safeMethod(x.method) {
		return
	}
	g.tel.writes.add(writeKey{code, writeMethod(x.method)})
	g.auditEnd(x, code)
}

// writeMethod bounds the method attribute of MetricWrites.
func writeMethod(m string) string {
	switch m {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return m
	}
	return "_OTHER"
}

// methodString is a request's method as a string, without allocating for
// the standard ones.
func methodString(m []byte) string {
	switch string(m) {
	case http.MethodGet:
		return http.MethodGet
	case http.MethodHead:
		return http.MethodHead
	case http.MethodPost:
		return http.MethodPost
	case http.MethodPut:
		return http.MethodPut
	case http.MethodPatch:
		return http.MethodPatch
	case http.MethodDelete:
		return http.MethodDelete
	case http.MethodOptions:
		return http.MethodOptions
	}
	return string(m)
}
