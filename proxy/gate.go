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
// The engines (see Server): on Linux, event loops (one per CPU,
// epoll) serve a TCP listener (a TLS one through a relay that terminates
// TLS in Go, looptls_linux.go) and forward plain HTTP/1.1 requests
// themselves, without a goroutine per request, admitting in the loop, in
// batches or on a goroutine as the store allows (loopengine_linux.go); a request
// they do not take (a large or chunked body, an upgrade, Expect, HTTP/1.0,
// a head they do not read) hands its connection to the general engine,
// net/http's server with the gate as its handler (httpengine.go), which
// serves it from then on and forwards through net/http's transport. The
// general engine alone serves HTTP/2 (by ALPN on TLS), h2c, gRPC,
// Unix-socket and HTTP/2 upstreams, and every listener off Linux. Both
// take the same decision (decide), admission pipeline (admitWrite) and
// upstream policy (policy.go). Bodies up to Options.BodyBuffer bytes are
// read in full before the write is admitted; larger or chunked ones
// stream to the upstream without being held in memory.
//
// Telemetry (see Options.MeterProvider and Options.TracerProvider): every
// unsafe request is counted once in fencegate.gate.writes by its final
// outcome; every request is measured in http.server.request.duration, and
// gets an HTTP server span when a tracer provider is set. Measurements
// reuse attribute sets built once, so they allocate nothing per request.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

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

// Gate is the write gate. Serve it with NewServer. Safe for concurrent use.
type Gate struct {
	upstream                   *url.URL
	upstreamBase               string // the upstream URL's escaped path, without a trailing slash
	upstreamHost               []byte // the upstream URL's host, as the Host header it gets
	dialer                     *upstreamDialer
	pooled, fresh              *httputil.ReverseProxy // the general engine's forwarders: pooled connections, or one per request
	urlScheme                  string                 // the scheme and host of the URLs the transport gets
	urlHost                    string
	upstreamConns              int
	noWriteReuse               bool
	upstreamHTTP2              bool // the general engine serves every request (Options.UpstreamHTTP2)
	upstreamTO                 time.Duration
	rules                      atomic.Pointer[[]Rule] // replaced whole by SetRules
	resourceHeader             bool
	resourceHeaderWithoutRules bool
	log                        *slog.Logger
	barrierTimeout             time.Duration
	grace                      time.Duration
	bodyTimeout                time.Duration
	bodyBuffer                 int
	holds                      fencing.HoldRecorder
	barrier                    *barrier.Barrier
	order                      orderer               // localOrder over barrier, or a *sharedOrder (shared.go)
	quick                      fencing.QuickAdmitter // the store's, when it can admit at once; or nil
	batch                      fencing.BatchAdmitter // the store's, when it admits in batches; or nil
	marks                      fencing.MarkReaders   // the batching store's, when the loops may read marks themselves; or nil
	tel                        telemetry
	// barrierOff skips the barrier wait. Only tests set it, to show the
	// reordering the barrier prevents.
	barrierOff bool
	// beforeSend, when set, runs before each request is sent upstream.
	// Only tests set it, to add latency on the way to the upstream.
	beforeSend func()
	// afterRulesLoad, when set, runs each time a decision has loaded the
	// rule set. Only tests set it, to reload the rules at that moment.
	afterRulesLoad func()
	audit          Audit
	logBatch       LogBatch // or nil
	inFlight       auditSet // the audit record of every write still in the gate
}

// New builds a Gate. It checks the options but contacts neither the store
// nor the upstream.
func New(opts Options) (*Gate, error) {
	u := opts.Upstream
	switch {
	case u == nil:
		return nil, errors.New("proxy: Upstream is required")
	case u.Scheme == "unix":
		if !strings.HasPrefix(u.Path, "/") || u.Host != "" {
			return nil, errors.New("proxy: a unix: Upstream names an absolute socket path (unix:/run/svc.sock)")
		}
	case (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, errors.New("proxy: Upstream must be an absolute http or https URL, or unix:/absolute/path.sock")
	}
	if opts.Store == nil {
		return nil, errors.New("proxy: Store is required")
	}
	for i := range opts.Rules {
		if opts.Rules[i].Action == 0 || opts.Rules[i].segs == nil {
			return nil, fmt.Errorf("proxy: rule %d was not built by ParseRules", i+1)
		}
	}
	if opts.BarrierTimeout < 0 || opts.UpstreamTimeout < 0 || opts.BodyTimeout < 0 || opts.UpstreamConns < 0 {
		return nil, errors.New("proxy: BarrierTimeout, UpstreamTimeout, BodyTimeout and UpstreamConns must not be negative")
	}
	g := &Gate{
		upstream:                   u,
		upstreamBase:               strings.TrimSuffix(u.EscapedPath(), "/"),
		upstreamHost:               []byte(u.Host),
		upstreamTO:                 cmp.Or(opts.UpstreamTimeout, DefaultUpstreamTimeout),
		resourceHeader:             opts.ResourceHeader,
		resourceHeaderWithoutRules: opts.ResourceHeaderWithoutRules,
		log:                        opts.Logger,
		barrierTimeout:             cmp.Or(opts.BarrierTimeout, DefaultBarrierTimeout),
		grace:                      cmp.Or(opts.TimeoutGrace, DefaultTimeoutGrace),
		bodyTimeout:                cmp.Or(opts.BodyTimeout, DefaultBodyTimeout),
		bodyBuffer:                 cmp.Or(opts.BodyBuffer, DefaultBodyBuffer),
		holds:                      opts.Holds,
		barrier:                    barrier.New(),
		audit:                      opts.Audit,
		logBatch:                   opts.LogBatch,
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.audit.limit.PerSecond = RefusalsPerSecond
	g.rules.Store(&opts.Rules)
	g.order = localOrder{b: g.barrier, store: opts.Store}
	caps := fencing.CapabilitiesOf(opts.Store)
	g.quick, g.batch = caps.Quick, caps.Batch
	if caps.Keep != nil {
		// The store's retention keeps the records of the writes this
		// barrier has in flight or holds (DESIGN §12).
		caps.Keep.KeepInFlight(g.barrier.InFlight)
	}
	if g.batch != nil {
		g.marks = caps.Marks // a mark reader's unsettled requests go in a batch
	}
	if opts.SharedBarrier != nil {
		o, err := newSharedOrder(opts.SharedBarrier, opts, g.log, g.barrierTimeout+g.bodyTimeout, g.grace)
		if err != nil {
			return nil, err
		}
		g.order = o
	}
	g.upstreamConns = cmp.Or(opts.UpstreamConns, DefaultUpstreamConns)
	g.noWriteReuse = opts.NoWriteReuse
	g.upstreamHTTP2 = opts.UpstreamHTTP2
	g.dialer = newUpstreamDialer(u)
	g.urlScheme, g.urlHost = upstreamScheme(u), u.Host
	if u.Scheme == "unix" {
		g.upstreamBase, g.urlHost = "", unixHost
	}
	var pooled http.RoundTripper = newTransport(u, g.dialer, g.upstreamConns, opts.UpstreamTLS, opts.UpstreamHTTP2, true)
	if !opts.UpstreamHTTP2 {
		pooled = staleConnCheck{next: pooled, tries: g.upstreamConns + 1}
	}
	g.pooled = g.newReverseProxy(pooled)
	g.fresh = g.newReverseProxy(newTransport(u, g.dialer, g.upstreamConns, opts.UpstreamTLS, opts.UpstreamHTTP2, false))
	if err := g.tel.init(opts); err != nil {
		return nil, err
	}
	return g, nil
}

// exchange is one request's passage through the gate: what telemetry, the
// audit log and the problem writer need to know about it.
type exchange struct {
	c *loopRequest // the event loops' request, or nil
	// w and r are the general engine's (net/http) request, or nil.
	w        *answerWriter
	r        *http.Request
	grpc     bool            // r is a gRPC call: refusals are gRPC answers
	ctx      context.Context // carries the request's span, if any
	span     trace.Span      // nil without a tracer provider
	start    time.Time
	id       string
	method   string
	path     string       // the request target's path, as sent
	route    string       // the matched rule's pattern, or ""
	audit    *auditRecord // &auditRec for a write, nil for a read
	auditRec auditRecord
	body     *bodyReader    // a streamed body while it is forwarded, or nil
	flight   *sendingFlight // the general engine's write in flight to the upstream, or nil
	buffered *[]byte        // a body read in full (bufferBody), or nil
	// replay gives the body again for another attempt on another
	// connection while nothing of the request was sent (staleConnCheck;
	// set by rewrite), or nil.
	replay  func() (io.ReadCloser, error)
	bodyErr error // the body read with the head failed (the event loops)
	// destination replaces the client's Destination upstream, if not ""
	// (Decision.Destination).
	destination string

	// headerBuf holds the values upstreamHeaders makes: an address and a
	// request id (at most reqid.MaxBytes) fit.
	headerBuf [64 + reqid.MaxBytes]byte
	// targets holds the decision's targets (at most two: a write's own
	// resource and its Destination's).
	targets [2]Target
}

// open begins x's passage through the gate on the event loops: its
// request id, the gate's decision on it, its telemetry and audit record.
// Every open is ended by end once x's answer is set. scratch, when not nil,
// is a map open may clear and reuse for the headers decide reads (see
// decisionHeader). start is when the request arrived: its duration is
// measured from then. ctx bounds x's admission and its wait for a turn
// (the event loops': cancelled when they stop).
func (g *Gate) open(ctx context.Context, c *loopRequest, scratch http.Header, start time.Time) (*exchange, Decision) {
	x := &exchange{c: c, ctx: ctx, start: start}
	x.id = reqid.Choose(c.value(reqid.Header))
	x.method = methodString(c.head.Method)
	th := string(c.head.Target) + string(c.head.Host) // the target and the host in one allocation
	target, host := th[:len(c.head.Target)], th[len(c.head.Target):]
	return x, g.judge(x, Incoming{Method: x.method, Target: target, Host: host, Header: decisionHeader(c, scratch)})
}

// judge decides on x's request, as in, and begins its telemetry and audit
// record: the part of opening an exchange every engine shares.
func (g *Gate) judge(x *exchange, in Incoming) Decision {
	x.path, _, _ = strings.Cut(in.Target, "?")
	in.targets = x.targets[:0]
	d := g.decide(in)
	x.destination = d.Destination
	if d.Rule != nil {
		x.route = d.Rule.Pattern
	}
	g.begin(x)
	return d
}

// pass is what verdict leaves to do with a request.
type pass int

const (
	passAnswered pass = iota // refused: x's answer is set
	passForward              // forward as is, unfenced
	passUpgrade              // forward as a protocol upgrade (forwardUpgrade)
	passFence                // a fenced write: admitWrite, then forward
)

// verdict applies decision d to x without waiting on anything: a refusal
// is answered; a fenced write gets its body read in full first when it is
// small (see bufferBody), so a client that stalls it never holds a place at
// the barrier.
func (g *Gate) verdict(x *exchange, d Decision) pass {
	switch d.Verdict {
	case Refuse:
		g.refuse(x, d.Problem)
		return passAnswered
	case Forward:
		if d.Unfenced {
			g.count(x, CodeUnfenced)
		}
		if d.DropUpgrade {
			// Forwarded as a plain request: the headers Connection lists
			// (HTTP2-Settings) go with it as hop-by-hop.
			x.delUpgrade()
		} else if x.upgrade() {
			return passUpgrade // an upgrade a rule allows
		}
		return passForward
	}
	resource := d.Targets[0].Resource
	x.audit.checked(resource, d.Token)
	if x.span != nil && x.span.IsRecording() {
		x.span.SetAttributes(attrResource.String(resource), attrToken.Int64(int64(d.Token)))
	}
	if p := g.bufferBody(x); p != nil {
		g.refuseWrite(x, p, resource, d.Token)
		return passAnswered
	}
	return passFence
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
func (g *Gate) refuseWrite(x *exchange, err error, resource string, token fencing.Token) {
	src := problem.From(err)
	p := *src // a copy: the extension members are this write's
	p.Extra = make(map[string]any, len(src.Extra)+2)
	maps.Copy(p.Extra, src.Extra)
	p.Extra["resource"] = resource
	p.Extra["token"] = token
	x.audit.problem(&p)
	g.refuse(x, &p)
}

// refuse answers x with a problem, counting the write by its code.
func (g *Gate) refuse(x *exchange, err error) {
	p := problem.From(err)
	g.count(x, p.Code)
	if p.Status < 500 && g.log.Enabled(x.ctx, slog.LevelDebug) {
		g.log.LogAttrs(x.ctx, slog.LevelDebug, "write refused",
			slog.String("code", p.Code), slog.String("method", x.method), slog.String("path", x.path))
	}
	g.writeProblem(x, p)
}

// writeProblem sends p as x's response (see problem.Write).
func (g *Gate) writeProblem(x *exchange, p *problem.Error) {
	problem.LogFault(x.ctx, g.log, p, x.id, x.method, x.path)
	if x.w != nil {
		g.writeProblemHTTP(x, p)
		return
	}
	if x.c.answer == nil {
		x.c.answer = make(http.Header, 4)
	}
	h := x.c.answer
	for k, vs := range p.Headers {
		k = http.CanonicalHeaderKey(k)
		h[k] = append(h[k], vs...)
	}
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Type", problem.ContentType)
	x.c.status = p.Status
	x.c.answerBody = p.Body()
}

// Rules are the rules in force.
func (g *Gate) Rules() []Rule { return *g.rules.Load() }

// SetRules replaces the rules in force (a reload): requests judged from
// now on follow rules; a request already judged goes on under the rules
// it was judged by. rules must come from ParseRules.
func (g *Gate) SetRules(rules []Rule) error {
	for i := range rules {
		if rules[i].Action == 0 || rules[i].segs == nil {
			return fmt.Errorf("proxy: rule %d was not built by ParseRules", i+1)
		}
	}
	g.rules.Store(&rules)
	return nil
}

// InFlightResources is the number of resources that have fenced writes in
// flight (or held closed for the grace period after an ambiguous upstream
// outcome). It returns to zero when the gate is idle: per-resource state
// does not outlive the writes.
func (g *Gate) InFlightResources() int { return g.barrier.Size() }
