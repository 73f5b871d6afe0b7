package proxy

import (
	"crypto/tls"
	"log/slog"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/fencing"
)

// Defaults for the zero values of Options.
const (
	DefaultBarrierTimeout  = 10 * time.Second
	DefaultTimeoutGrace    = 30 * time.Second
	DefaultUpstreamTimeout = 30 * time.Second
	DefaultBodyTimeout     = 10 * time.Second
	DefaultBodyBuffer      = 16 << 10
	DefaultUpstreamConns   = 1024
)

// NoGrace, as Options.TimeoutGrace, turns the grace period off: the barrier
// opens as soon as a write's outcome is unknown.
const NoGrace time.Duration = -1

// Options configure a Gate.
type Options struct {
	// Upstream is the service the gate forwards to: an absolute http or
	// https URL, whose path is prefixed to every request path; or
	// unix:/absolute/path.sock, a Unix socket the requests go to with their
	// own path and Host.
	Upstream *url.URL
	// UpstreamHTTP2 speaks HTTP/2 to the upstream: with prior knowledge
	// (h2c) to an http or unix upstream, by ALPN to an https one. Requests
	// then go through the general engine.
	UpstreamHTTP2 bool
	// NoWriteReuse sends every write on an upstream connection of its own,
	// closed after the answer: an upstream that sends bytes after a
	// complete response (a framing bug) can then never make a later
	// write's client read them as its answer. Writes then go through the
	// general engine.
	NoWriteReuse bool
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
	// ResourceHeaderWithoutRules turns the fallback on while the rules in
	// force are none, and off as soon as a reload (SetRules) brings some:
	// the binary's default when FENCEGATE_RESOURCE_HEADER is unset.
	// ResourceHeader, when set, keeps it on regardless.
	ResourceHeaderWithoutRules bool
	// Logger receives upstream and store faults; nil discards.
	Logger *slog.Logger
	// BarrierTimeout bounds how long an admitted write waits behind
	// lower-token writes in flight on its resource; past it the write is
	// refused with 503 barrier-timeout and not forwarded. Zero means
	// DefaultBarrierTimeout. A client that leaves while its write waits
	// does not free its place before the write is forwarded or the wait
	// ends: the gate does not watch idle client connections.
	BarrierTimeout time.Duration
	// TimeoutGrace is how long the barrier stays closed for higher tokens
	// on a resource after a write on it ended without the gate seeing the
	// upstream's answer (timeout, connection lost after sending, client
	// gone, a request body cut off). Zero means DefaultTimeoutGrace;
	// negative (NoGrace) means no grace.
	TimeoutGrace time.Duration
	// BodyTimeout bounds how long a request's body may take to arrive
	// from the client: a body of at most BodyBuffer bytes is read in full
	// before the write is admitted, within BodyTimeout (408 body-timeout,
	// nothing forwarded, no barrier held); a larger or chunked body
	// streams, and must be complete within BodyTimeout counted from when
	// the gate starts forwarding it (after the barrier). A streamed write
	// whose body is not complete by then is cut off, answered 408
	// body-timeout, and treated as an ambiguous outcome (the barrier is
	// held for TimeoutGrace): so a stalled client holds its resource's
	// barrier for at most BodyTimeout plus the grace. Zero means
	// DefaultBodyTimeout.
	BodyTimeout time.Duration
	// BodyBuffer is the largest request body (by its Content-Length) the
	// gate reads in full before admitting a write and sends upstream in
	// one piece; larger and chunked bodies stream through in
	// fixed-size pieces, so a 1 GiB upload costs the gate no more memory
	// than a small one. Zero means DefaultBodyBuffer; negative streams
	// every body.
	BodyBuffer int
	// Holds, when set, keeps barrier holds across a restart of the gate
	// (see RestoreHolds and Close). Nil: a restart forgets them.
	Holds fencing.HoldRecorder
	// UpstreamTimeout bounds one exchange with the upstream: sending the
	// request, and receiving the whole response (headers and body). A
	// response whose headers do not arrive in time is answered 504
	// upstream-timeout; one whose body does not is cut off. Zero means
	// DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	// UpstreamConns caps the gate's connections to the upstream; a request
	// that finds them all busy waits for one, within UpstreamTimeout.
	// Zero means DefaultUpstreamConns.
	UpstreamConns int
	// UpstreamTLS configures TLS to an https upstream; nil means the
	// system's roots and TLS 1.2 at least.
	UpstreamTLS *tls.Config
	// MeterProvider receives the gate's metrics: the fenced-write counter
	// (see MetricWrites) and the HTTP server metrics of the OpenTelemetry
	// semantic conventions (http.server.request.duration and the body
	// sizes), with http.route set to the matching rule's pattern. Nil
	// means no metrics. The fencegate binary passes a provider of its own
	// (internal/atomichist, not importable outside this module) that keeps
	// the request duration histogram in atomics, about 20 ns a request
	// instead of the SDK's 200 to 250; any other provider records through
	// its own instruments.
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
	// LogBatch, when set, is held by each event loop for every pass over
	// its ready sockets (Hold before, Release after). Make it the
	// Logger's output, one that keeps what is written while held and
	// writes it out on Release (the fencegate binary's is
	// internal/logwriter), and the audit lines of a pass go out in one
	// write at its end instead of one write each.
	LogBatch LogBatch
	// SharedBarrier, when set, orders writes across every gate on one
	// shared store instead of through this gate only (DESIGN §9): each
	// write is admitted and registered in one atomic store step and waits
	// for lower-token writes in flight through any gate. Pass the
	// concrete store's capability, not a decorator. Entries live for
	// BarrierTimeout + BodyTimeout + UpstreamTimeout + TimeoutGrace by the
	// store's clock.
	SharedBarrier fencing.SharedBarrier
	// GateID names this gate in its shared-barrier entries. Required
	// with SharedBarrier.
	GateID string
}

// LogBatch is what an event loop holds while it runs a pass (see
// Options.LogBatch).
type LogBatch interface {
	Hold()
	Release()
}
