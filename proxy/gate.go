// Package proxy is fencegate's write gate: a reverse proxy that forwards
// safe requests unchanged and lets an unsafe one (a write) through only when
// its Fencing-Token is admitted by the lease store for the write's resource,
// and only after every lower-token write on that resource in flight through
// this gate has been answered by the upstream.
//
// Guarantee, per resource R, for writes that pass through one Gate: a write
// with token t is forwarded only if the store admitted t (high_water(R) <= t
// <= issued(R), raising high_water(R) to t atomically), and never while a
// write with a lower token for R is still in flight to the upstream, so the
// upstream receives R's writes in non-decreasing token order. Every fenced
// write is either forwarded once, with the upstream's answer relayed as is,
// or refused with an application/problem+json body, and a refused write's
// body is never sent upstream.
//
// Limits: reads are not fenced; writes that bypass the gate are not fenced;
// side effects the upstream causes elsewhere are not fenced. A write whose
// outcome the gate did not see (upstream timeout, connection lost after
// sending, client gone, its body cut off) may still be applied later, so
// the barrier stays closed for its resource for Options.TimeoutGrace, also
// across a restart when Options.Holds is set; an upstream slower than that
// can still apply it after a newer write. A forwarded body must arrive
// within Options.BodyTimeout, so a stalled client holds its resource for at
// most that plus the grace. A write counts as in flight
// until the upstream's response headers arrive: an upstream that answers
// before applying (202 Accepted and a queue) is not ordered by the gate.
// Several gates sharing one store share the high-water mark but not the
// barrier: each orders only the writes that pass through it, unless they
// share the store's barrier too (Options.SharedBarrier, shared.go).
//
// The edge: the gate decides from what the client sent (method, raw
// request target, headers) alone, and refuses what an upstream could read
// differently from the gate: non-canonical paths on writes (CheckPath),
// method and path overrides, protocol upgrades (allowed on reads only by
// an upgrade rule), CONNECT and h2c. A write whose Destination header names
// a second target is fenced on both resources. Writes are forwarded with
// exactly the path bytes that were judged. See Gate.decide.
//
// Telemetry (see Options.MeterProvider and Options.TracerProvider): every
// unsafe request is counted once in fencegate.gate.writes by its final
// outcome, and every request gets an HTTP server span and the HTTP
// semantic-convention server metrics.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/barrier"
	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/fencing/reqid"
)

// Header names read by the gate. Both are forwarded to the upstream
// unchanged.
const (
	// HeaderToken carries the writer's fencing token in decimal.
	HeaderToken = "Fencing-Token"
	// HeaderResource names the write's resource when no rule matches and
	// Options.ResourceHeader is on.
	HeaderResource = "Fencing-Resource"
)

// Defaults for the zero values of Options.
const (
	DefaultBarrierTimeout  = 10 * time.Second
	DefaultTimeoutGrace    = 30 * time.Second
	DefaultUpstreamTimeout = 30 * time.Second
	DefaultBodyTimeout     = 10 * time.Second
)

// NoGrace, as Options.TimeoutGrace, turns the grace period off: the barrier
// opens as soon as a write's outcome is unknown.
const NoGrace time.Duration = -1

// Options configure a Gate.
type Options struct {
	// Upstream is the service the gate forwards to: an absolute http or
	// https URL. Its path is prefixed to every request path.
	Upstream *url.URL
	// Store admits fenced writes. Required.
	Store fencing.Store
	// Rules map unsafe requests to an action and a resource, first match
	// wins (see ParseRules).
	Rules []Rule
	// ResourceHeader lets a fenced write name its resource in the
	// Fencing-Resource header when no rule matches it. Without it such a
	// write is refused with 400 resource-required. With rules, leave it
	// off: it lets a client choose the resource of any write the rules
	// miss (the binary turns it on by default only without rules).
	ResourceHeader bool
	// Logger receives upstream and store faults; nil discards.
	Logger *slog.Logger
	// BarrierTimeout bounds how long an admitted write waits behind
	// lower-token writes in flight on its resource; past it the write is
	// refused with 503 barrier-timeout and not forwarded. Zero means
	// DefaultBarrierTimeout. A client that leaves while its write waits
	// frees its place at once if its request body was already received
	// in full; otherwise net/http cannot tell, and the wait ends at
	// BarrierTimeout.
	BarrierTimeout time.Duration
	// TimeoutGrace is how long the barrier stays closed for higher tokens
	// on a resource after a write on it ended without the gate seeing the
	// upstream's answer (timeout, connection lost after sending, client
	// gone, a request body cut off). Zero means DefaultTimeoutGrace;
	// negative (NoGrace) means no grace.
	TimeoutGrace time.Duration
	// BodyTimeout bounds how long a forwarded request's body may take to
	// arrive from the client, counted from when the gate starts forwarding
	// it (after the barrier). A write whose body is not complete by then
	// is cut off, answered 408 body-timeout, and treated as an ambiguous
	// outcome (the barrier is held for TimeoutGrace): so a stalled client
	// holds its resource's barrier for at most BodyTimeout plus the grace.
	// It sets the connection's read deadline through
	// http.ResponseController. Zero means DefaultBodyTimeout.
	BodyTimeout time.Duration
	// Holds, when set, keeps barrier holds across a restart of the gate
	// (see RestoreHolds and Close). Nil: a restart forgets them.
	Holds fencing.HoldRecorder
	// UpstreamTimeout is how long the gate waits for the upstream's
	// response headers before answering 504 upstream-timeout. It is set
	// on the default transport only; a caller-supplied Transport keeps
	// its own timeouts. Zero means DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	// Transport carries requests to the upstream; nil means a transport
	// built by NewTransport.
	Transport http.RoundTripper
	// MeterProvider receives the gate's metrics: the fenced-write counter
	// (see MetricWrites) and the HTTP server metrics of the OpenTelemetry
	// semantic conventions (http.server.request.duration and the body
	// sizes), with http.route set to the matching rule's pattern. Nil
	// means no metrics.
	MeterProvider metric.MeterProvider
	// TracerProvider receives a server span per request, named
	// "{method} {rule pattern}" or "{method} gate" when no rule matched,
	// with the write's resource, token and outcome code as attributes. An
	// incoming W3C traceparent header is honoured as the parent. Nil means
	// no spans (spans started by the caller's store decorator still nest
	// under the caller's context).
	TracerProvider trace.TracerProvider
	// ServerName is the listener's host:port, reported as server.address
	// and server.port in HTTP telemetry. Empty means the request's Host
	// header, which the client controls: set it where clients are not
	// trusted, so they cannot create metric series at will.
	ServerName string
	// Audit configures the audit log of writes (see AuditMessage).
	Audit Audit
	// SharedBarrier, when set, orders writes across every gate on one
	// shared store instead of through this gate only (DESIGN §9): each
	// write is admitted and registered in one atomic store step and waits
	// for lower-token writes in flight through any gate. Pass the
	// concrete store's capability, not a decorator. Entries live for
	// BarrierTimeout + BodyTimeout + UpstreamTimeout + TimeoutGrace by the
	// store's clock; a caller-supplied Transport must not take longer than
	// UpstreamTimeout to answer, or a write whose outcome was not seen
	// may outlive its entry.
	SharedBarrier fencing.SharedBarrier
	// GateID names this gate in its shared-barrier entries. Required
	// with SharedBarrier.
	GateID string
}

// Gate is the write gate: an http.Handler. Safe for concurrent use.
type Gate struct {
	upstream       *url.URL
	store          fencing.Store
	rules          []Rule
	resourceHeader bool
	log            *slog.Logger
	barrierTimeout time.Duration
	grace          time.Duration
	bodyTimeout    time.Duration
	holds          fencing.HoldRecorder
	rp             *httputil.ReverseProxy
	barrier        *barrier.Barrier
	order          orderer // localOrder over barrier, or a *sharedOrder (shared.go)
	writes         metric.Int64Counter
	writeOpts      map[writeKey][]metric.AddOption // read-only after New
	handler        http.Handler                    // serve, wrapped with otelhttp when telemetry is on
	// barrierOff skips the barrier wait. Only tests set it, to show the
	// reordering the barrier prevents.
	barrierOff bool
	audit      Audit
	inFlight   sync.Map // *auditRecord of every write still in the gate
}

// New builds a Gate. It checks the options but contacts neither the store
// nor the upstream.
func New(opts Options) (*Gate, error) {
	u := opts.Upstream
	if u == nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("proxy: Upstream must be an absolute http or https URL")
	}
	if opts.Store == nil {
		return nil, errors.New("proxy: Store is required")
	}
	for i := range opts.Rules {
		if opts.Rules[i].Action == 0 || opts.Rules[i].segs == nil {
			return nil, fmt.Errorf("proxy: rule %d was not built by ParseRules", i+1)
		}
	}
	if opts.BarrierTimeout < 0 || opts.UpstreamTimeout < 0 || opts.BodyTimeout < 0 {
		return nil, errors.New("proxy: BarrierTimeout, UpstreamTimeout and BodyTimeout must not be negative")
	}
	g := &Gate{
		upstream:       u,
		store:          opts.Store,
		rules:          opts.Rules,
		resourceHeader: opts.ResourceHeader,
		log:            opts.Logger,
		barrierTimeout: opts.BarrierTimeout,
		grace:          opts.TimeoutGrace,
		bodyTimeout:    opts.BodyTimeout,
		holds:          opts.Holds,
		barrier:        barrier.New(),
		audit:          opts.Audit,
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.barrierTimeout == 0 {
		g.barrierTimeout = DefaultBarrierTimeout
	}
	if g.grace == 0 {
		g.grace = DefaultTimeoutGrace
	}
	if g.bodyTimeout == 0 {
		g.bodyTimeout = DefaultBodyTimeout
	}
	g.order = localOrder{b: g.barrier, store: g.store}
	if opts.SharedBarrier != nil {
		o, err := newSharedOrder(opts.SharedBarrier, opts, g.log, g.barrierTimeout+g.bodyTimeout, g.grace)
		if err != nil {
			return nil, err
		}
		g.order = o
	}
	rt := opts.Transport
	if rt == nil {
		ut := opts.UpstreamTimeout
		if ut == 0 {
			ut = DefaultUpstreamTimeout
		}
		rt = NewTransport(ut)
	}
	g.rp = &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      rt,
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.errorHandler,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
		BufferPool:     bufferPool{},
	}
	if err := g.instrument(opts); err != nil {
		return nil, err
	}
	// Outermost, so telemetry, logs and the upstream all see one id.
	g.handler = reqid.Middleware(g.auditWrites(g.handler))
	return g, nil
}

// flightKey is the context key of the *fencedWrite of a forwarded write.
type flightKey struct{}

// fencedWrite is the state of one forwarded request while the reverse
// proxy forwards it: an admitted write (ticket set) or an unfenced request
// (ticket nil). ModifyResponse and ErrorHandler run on the goroutine of
// ServeHTTP, so no locking is needed.
type fencedWrite struct {
	ticket flight      // nil for an unfenced request
	body   *bodyReader // nil when the request has no body
	code   string      // final outcome for MetricWrites
}

// ServeHTTP forwards safe requests and fences the rest.
func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.handler.ServeHTTP(w, r) }

func (g *Gate) serve(w http.ResponseWriter, r *http.Request) {
	// The decision is made from what the client sent, nothing else: see
	// decide for the contract.
	d := g.decide(Incoming{Method: r.Method, Target: requestTarget(r), Host: r.Host, Header: r.Header})
	if d.Rule != nil {
		// Like http.ServeMux: the matched pattern, which the HTTP
		// telemetry reports as http.route.
		r.Pattern = d.Rule.Pattern
	}
	switch d.Verdict {
	case Refuse:
		g.refuse(w, r, d.Problem)
		return
	case Forward:
		if d.Unfenced {
			g.count(r, CodeUnfenced)
		}
		if d.DropUpgrade {
			// Without it the reverse proxy forwards a plain request, and
			// drops the headers Connection lists (HTTP2-Settings).
			r.Header.Del("Upgrade")
		}
		g.forward(w, r, &fencedWrite{})
		return
	}
	token := d.Token
	resource := d.Targets[0].Resource
	auditWrite(r, resource, token)
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		span.SetAttributes(attrResource.String(resource), attrToken.Int64(int64(token)))
	}

	// Registered before (local barrier) or with (shared barrier) the
	// admission check: any write admitted before this one is already
	// registered, so the wait below cannot miss it. A write with a
	// Destination registers and is admitted on both resources.
	ctx := r.Context()
	t, resource, adm, err := g.order.admit(ctx, d.Targets, token)
	auditAdmission(r, adm)
	if err != nil {
		if ctx.Err() != nil {
			g.count(r, CodeClientGone)
			return // client gone: nobody to answer
		}
		g.refuseWrite(w, r, err, resource, token)
		return
	}
	if err := g.wait(ctx, t); err != nil {
		t.Leave()
		if ctx.Err() != nil {
			g.count(r, CodeClientGone)
			return
		}
		if errors.Is(err, barrier.ErrClosed) {
			p := problem.New(http.StatusServiceUnavailable, "gate-stopping",
				"the gate is shutting down; this write was admitted but not forwarded: retry it with the same token")
			p.Headers = http.Header{"Retry-After": {"1"}}
			g.refuseWrite(w, r, p, resource, token)
			return
		}
		if fencing.IsStoreFault(err) { // the shared barrier's store failed
			g.refuseWrite(w, r, err, resource, token)
			return
		}
		p := problem.New(http.StatusServiceUnavailable, "barrier-timeout",
			"a write with a lower token for this resource is still in flight through this gate (or, with the shared barrier, any gate), or the barrier is held closed after a write whose outcome is unknown (upstream timeout, body cut off, restart); this write was admitted but not forwarded: retry it with the same token")
		p.Headers = http.Header{"Retry-After": {strconv.Itoa(retryAfter(g.order.heldUntil(d.Targets)))}}
		g.refuseWrite(w, r, p, resource, token)
		return
	}
	defer t.Leave()
	fw := &fencedWrite{ticket: t, code: CodeAdmitted}
	// Deferred so a write whose response relay is aborted still counts.
	defer func() { g.count(r, fw.code) }()
	g.forward(w, r, fw)
}

// forward sends r to the upstream with fw as its in-flight state, bounding
// how long its body may take to arrive (Options.BodyTimeout).
func (g *Gate) forward(w http.ResponseWriter, r *http.Request, fw *fencedWrite) {
	hasBody := r.Body != nil && r.Body != http.NoBody
	if fw.ticket == nil && !hasBody {
		g.rp.ServeHTTP(w, r) // nothing to track: the common read
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), flightKey{}, fw))
	// A request without a body is left alone: net/http is already
	// reading its connection in the background, and a deadline would end
	// that read and cancel the request.
	if hasBody {
		if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(g.bodyTimeout)); err != nil {
			g.log.LogAttrs(r.Context(), slog.LevelWarn, "cannot bound the request body's read time",
				slog.String("error", err.Error()))
		}
		fw.body = &bodyReader{ReadCloser: r.Body}
		r.Body = fw.body
	}
	g.rp.ServeHTTP(w, r)
}

func (g *Gate) wait(ctx context.Context, t flight) error {
	if g.barrierOff {
		return nil
	}
	return t.Wait(ctx, g.barrierTimeout)
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// retryAfter is the Retry-After, in whole seconds (at least 1), for a
// barrier held until heldUntil (zero: not held, only busy).
func retryAfter(heldUntil time.Time) int {
	return max(1, int(math.Ceil(time.Until(heldUntil).Seconds())))
}

// refuseWrite refuses a write whose resource and token are known, and says
// which resource and token were checked: with route rules, the resource
// comes from the path, which a caller may not expect.
func (g *Gate) refuseWrite(w http.ResponseWriter, r *http.Request, err error, resource string, token fencing.Token) {
	src := problem.From(err)
	p := *src // a copy: the extension members are this write's
	p.Extra = make(map[string]any, len(src.Extra)+2)
	maps.Copy(p.Extra, src.Extra)
	p.Extra["resource"] = resource
	p.Extra["token"] = token
	auditProblem(r, &p)
	g.refuse(w, r, &p)
}

func (g *Gate) refuse(w http.ResponseWriter, r *http.Request, err error) {
	p := problem.From(err)
	g.count(r, p.Code)
	if p.Status < 500 && g.log.Enabled(r.Context(), slog.LevelDebug) {
		g.log.LogAttrs(r.Context(), slog.LevelDebug, "write refused",
			slog.String("code", p.Code), slog.String("method", r.Method), slog.String("path", r.URL.Path))
	}
	problem.Write(w, r, g.log, p)
}

func (g *Gate) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(g.upstream)
	if !safeMethod(pr.In.Method) {
		// A write goes upstream with exactly the path the gate judged.
		forwardPath(pr.Out.URL, g.upstream, requestTarget(pr.In))
	}
	// SetXForwarded replaces any X-Forwarded-* the client sent: the gate
	// states what it saw, it does not relay claims.
	pr.SetXForwarded()
	// The fencing headers reach the upstream unchanged, even when the
	// client named them in Connection (which makes them hop-by-hop and
	// strips them): an upstream that checks tokens itself relies on them.
	for _, h := range []string{HeaderToken, HeaderResource} {
		if vs, ok := pr.In.Header[h]; ok {
			pr.Out.Header[h] = vs
		}
	}
	if id := reqid.From(pr.In); id != "" {
		pr.Out.Header.Set(reqid.Header, id)
	}
}

// modifyResponse runs when the upstream's response headers arrive: the
// upstream has answered the write, so the barrier can let the next token
// through while the body is still being relayed.
func (g *Gate) modifyResponse(resp *http.Response) error {
	if fw, ok := resp.Request.Context().Value(flightKey{}).(*fencedWrite); ok && fw.ticket != nil {
		fw.ticket.Leave()
		auditUpstream(resp)
	}
	return nil
}

// errorHandler maps a failed forwarding once: the client's request body
// failed (stalled past BodyTimeout → 408, malformed or cut short → 400),
// client gone → no response, upstream timeout → 504, anything else → 502.
// For a fenced write whose request may have reached the upstream, the
// barrier stays closed for the grace period.
func (g *Gate) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	fw, _ := r.Context().Value(flightKey{}).(*fencedWrite)
	if fw == nil {
		fw = &fencedWrite{}
	}
	fenced := fw.ticket != nil
	// A request whose headers were sent, even with its body cut off, may
	// be applied: an upstream can act on a request before reading its
	// body (a DELETE handler that ignores it), so only a request that
	// never left the gate is certainly not applied.
	sent := !notSent(err)
	if fenced {
		if sent {
			fw.ticket.Hold(g.grace)
		} else {
			fw.ticket.Leave()
		}
	}
	// The client's body error comes first: a read deadline or an early
	// end of the client's connection also cancels the request's context,
	// and the client may still be there to read the answer.
	p := bodyProblem(fw.body.failure(), fenced)
	if p == nil && r.Context().Err() != nil {
		if fenced {
			fw.code = CodeClientGone
		}
		return // the client is gone; there is nobody to answer
	}
	switch {
	case p != nil:
	case isTimeout(err):
		p = problem.New(http.StatusGatewayTimeout, "upstream-timeout", "the upstream did not answer in time")
		if fenced {
			p.Detail += "; the write may still be applied by the upstream"
		}
	default:
		p = problem.New(http.StatusBadGateway, "upstream-unavailable", "the upstream could not be reached or failed before answering")
		if fenced && sent {
			p.Detail += "; the write may have been applied by the upstream"
		}
	}
	p.Cause = err
	if fenced {
		fw.code = p.Code
	}
	problem.Write(w, r, g.log, p)
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// notSent reports whether err proves the request never left the gate: the
// connection to the upstream could not be made.
func notSent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// InFlightResources is the number of resources that have fenced writes in
// flight (or held closed for the grace period after an ambiguous upstream
// outcome). It returns to zero when the gate is idle: per-resource state
// does not outlive the writes.
func (g *Gate) InFlightResources() int { return g.barrier.Size() }
