// Package leaseapi is fencegate's lease REST API (the handlers served on
// FENCEGATE_API_ADDR) and a Go client for it.
//
// The server is a thin HTTP adapter over a fencing.Store: it decodes and
// bounds requests, calls the store, and renders answers as JSON and errors as
// application/problem+json through the one table in fencing/problem. It
// keeps no lease state of its own, so any number of servers may share one
// store; it only queues the acquisitions that wait on it (waiters.go).
//
// Endpoints (see routes.go): POST /v1/leases/{resource}/acquire, .../renew
// and .../release; PUT and GET /v1/leases/{resource}/checkpoint; GET
// /v1/leases/{resource} (status); GET /v1/leases?prefix=&limit= (live
// leases, limit 1 to 1000, default 1000); GET /livez (always 200); GET
// /readyz (200 when the store answers a ping within 1 s, 503
// "store-unavailable" otherwise unless Options.ReadyWithoutStore, 503
// "draining" after SetDraining); GET
// /metrics when Options.Metrics is set; GET /openapi.json (the OpenAPI 3.1
// document of all of these, see OpenAPI). HEAD is served wherever GET is. An
// unknown path is 404 "not-found"; a known path with another method is 405
// "method-not-allowed" with an Allow header. With an auth token set, every
// /v1 request, known path or not, is checked first.
//
// Request rules, stated once for every /v1 call:
//
//   - A request body must be sent with Content-Type application/json (a
//     charset parameter, if any, must be utf-8), in one header. Anything
//     else, including a missing Content-Type on a non-empty body or two
//     Content-Type headers, is 415
//     "unsupported-media-type". Requiring the JSON type keeps browsers from
//     posting to the API cross-site without a CORS preflight, which the API
//     never grants. With curl, pass -H 'Content-Type: application/json'.
//   - The body is one JSON object. Syntax errors, an empty body, trailing
//     data after the object, a body that is not an object, or one whose
//     reading fails before its end (it stopped arriving within the read
//     deadline) are 400 "invalid-json". Unknown members and members of the wrong type (a
//     string where an integer belongs) are 400 "invalid-request" naming the
//     member. A JSON null member counts as absent.
//   - Bodies are size-limited (LeaseBodyLimit for lease calls,
//     MaxCheckpointBytes+CheckpointBodyHeadroom for checkpoints); a larger
//     body is 413 "payload-too-large".
//   - The bodies held at once are bounded too (Options.BodyMemory, in all
//     and per client address): a call whose body would not fit is 503
//     "overloaded" with Retry-After, answered before its body is read.
//   - ttl_seconds and wait_seconds are integers. Absent ttl_seconds means
//     Options.DefaultTTL on acquire and "keep the lease's current TTL" on
//     renew; absent wait_seconds means do not wait. Out-of-bounds values
//     (ttl 0 or above 86400, wait above 60) are 400 "invalid-request".
//   - Resource names in the path may be percent-encoded; the decoded name
//     must pass fencing.ValidateResource.
//   - Every refusal changes nothing in the store.
//
// Every response carries Cache-Control: no-store and an X-Request-Id (the
// client's, when it sent a sane one, otherwise a generated one).
//
// For workers, beside the Client: Session keeps a lease alive and decides,
// conservatively and on its own clock, when it is lost; Session.Transport
// stamps and guards a worker's writes to the gate; Campaign runs a leader
// election.
package leaseapi

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/internal/loglimit"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// Body limits.
const (
	// LeaseBodyLimit bounds the body of acquire, renew and release. Their
	// members are small (an owner is at most 200 bytes).
	LeaseBodyLimit = 64 << 10
	// CheckpointBodyHeadroom is added to the checkpoint state limit to size
	// the checkpoint body limit, leaving room for owner, token and
	// whitespace around the state.
	CheckpointBodyHeadroom = 64 << 10
	// readyTimeout bounds the store ping behind /readyz.
	readyTimeout = time.Second
)

// Options configure a Server.
type Options struct {
	// Store holds the leases. Required.
	Store fencing.Store
	// Logger receives internal errors (with the request id) and panics;
	// nil discards them.
	Logger *slog.Logger
	// AuthToken, when non-empty, is required on every /v1 call as
	// "Authorization: Bearer <token>", compared in constant time. Missing
	// or wrong credentials are 401 "unauthorized" with WWW-Authenticate.
	// /livez, /readyz and /metrics stay open.
	AuthToken string
	// Access, when set, is who may do what (see package access): every /v1
	// call must come from one of its clients, by bearer token or verified
	// client certificate, and stay within the client's permissions (403
	// forbidden otherwise, nothing done); lists are filtered to what the
	// client may read. It replaces AuthToken, which must then be empty.
	// The policy in force is read at each request, so a File's Reload
	// applies to the next request.
	Access *access.File
	// DefaultTTL is the lease TTL when an acquire omits ttl_seconds; 0
	// means fencing.DefaultTTL. It must pass fencing.ValidateTTL.
	DefaultTTL time.Duration
	// MaxCheckpointBytes is the store's checkpoint state limit, used to
	// size the checkpoint body limit; 0 means
	// fencing.DefaultMaxCheckpointBytes. The store enforces the state
	// limit itself.
	MaxCheckpointBytes int
	// Metrics, when non-nil, is served at GET /metrics; otherwise /metrics
	// is 404.
	Metrics http.Handler
	// MeterProvider receives the HTTP server metrics of the OpenTelemetry
	// semantic conventions (http.server.request.duration and the request
	// and response body sizes), with http.route set to the chi route
	// pattern (such as /v1/leases/{resource}/acquire), never the raw path,
	// so resource names do not become metric series. Nil means no metrics.
	MeterProvider metric.MeterProvider
	// TracerProvider receives a server span per request, named
	// "{method} {route pattern}". An incoming W3C traceparent header is
	// honoured as the parent. Nil means no spans.
	TracerProvider trace.TracerProvider
	// ServerName is the listener's host:port, reported as server.address
	// and server.port in HTTP telemetry. Empty means the request's Host
	// header, which the client controls: set it where clients are not
	// trusted, so they cannot create metric series at will.
	ServerName string
	// AccessLog logs one line per API call (AccessMessage).
	AccessLog bool
	// ReadyWithoutStore keeps /readyz at 200 while the store does not
	// answer (the answer then says "store": "unavailable"), so an outage
	// of the store does not take the process out of its load balancer:
	// reads through the gate keep flowing, while writes and lease calls
	// still fail closed with 503 store-unavailable. Draining still answers
	// 503. Off by default: a pod that cannot fence is not ready.
	ReadyWithoutStore bool
	// MaxWaiting and MaxWaitingPerClient bound the acquisitions that wait
	// at once (wait_seconds), in all and per client address (0: no
	// bound); one beyond either is answered at once, as without a wait.
	// fencegate sets them to the listener's connection caps
	// (FENCEGATE_MAX_CONNS, FENCEGATE_MAX_CONNS_PER_CLIENT), which over
	// HTTP/1.1 bound them already: over HTTP/2 one connection carries many
	// streams.
	MaxWaiting, MaxWaitingPerClient int
	// BodyMemory bounds the request body bytes the API holds at once
	// (zero or less: DefaultBodyMemory): each call reserves its body's bytes before
	// reading any, and one the budget cannot cover is answered at once
	// with 503 "overloaded" and Retry-After, unread, nothing done. One
	// client address may hold half of it. Neither bound is ever
	// below one checkpoint body (MaxCheckpointBytes +
	// CheckpointBodyHeadroom). See bodybudget.go.
	BodyMemory int64
}

// Server serves the lease API. It implements http.Handler and is safe for
// concurrent use.
type Server struct {
	store           fencing.Store
	log             *slog.Logger
	authOn          bool
	authSum         [sha256.Size]byte
	access          *access.File
	limiter         *access.Limiter
	refusals        metric.Int64Counter // nil without a MeterProvider
	refusalLines    loglimit.Limiter    // the refusal lines' budget (RefusalLinesPerSecond)
	defaultTTL      time.Duration
	checkpointLimit int64
	metrics         http.Handler
	telemetry       bool // tag spans and metrics with the route pattern
	draining        atomic.Bool
	unready         atomic.Bool // the last /readyz store ping failed: log state changes only
	accessLog       bool
	readyNoStore    bool
	waiters         waitQueues    // the acquisitions waiting on this server (waiters.go)
	waitsEnded      chan struct{} // closed by EndWaits (waiters.go)
	endWaits        sync.Once
	waitSlots       waitSlots    // how many may wait (waitslots.go)
	bodies          *bodyBudget  // the request body bytes held at once (bodybudget.go)
	handler         http.Handler // the routes, wrapped with otelhttp when telemetry is on
}

var _ http.Handler = (*Server)(nil)

// NewServer builds the API over opts.Store. It panics when Store is nil or
// DefaultTTL or MaxCheckpointBytes is out of bounds: those are wiring
// mistakes that configuration validation catches before this point.
func NewServer(opts Options) *Server {
	if opts.Store == nil {
		panic("leaseapi: Options.Store is nil")
	}
	if opts.DefaultTTL == 0 {
		opts.DefaultTTL = fencing.DefaultTTL
	}
	if err := fencing.ValidateTTL(opts.DefaultTTL); err != nil {
		panic(fmt.Sprintf("leaseapi: Options.DefaultTTL: %v", err))
	}
	if opts.MaxCheckpointBytes == 0 {
		opts.MaxCheckpointBytes = fencing.DefaultMaxCheckpointBytes
	}
	if opts.MaxCheckpointBytes < 0 {
		panic("leaseapi: Options.MaxCheckpointBytes is negative")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Access != nil && opts.AuthToken != "" {
		panic("leaseapi: Options.Access and Options.AuthToken are both set")
	}
	s := &Server{
		store:           opts.Store,
		log:             opts.Logger,
		authOn:          opts.AuthToken != "",
		defaultTTL:      opts.DefaultTTL,
		checkpointLimit: int64(opts.MaxCheckpointBytes) + CheckpointBodyHeadroom,
		waitSlots:       waitSlots{total: max(opts.MaxWaiting, 0), perClient: max(opts.MaxWaitingPerClient, 0)},
		metrics:         opts.Metrics,
		telemetry:       opts.MeterProvider != nil || opts.TracerProvider != nil,
		access:          opts.Access,
		limiter:         access.NewLimiter(access.DefaultBurst, access.DefaultEvery, nil),
		accessLog:       opts.AccessLog,
		readyNoStore:    opts.ReadyWithoutStore,
		refusalLines:    loglimit.Limiter{PerSecond: RefusalLinesPerSecond},
		waitsEnded:      make(chan struct{}),
	}
	s.bodies = newBodyBudget(opts.BodyMemory, s.checkpointLimit)
	if opts.MeterProvider != nil {
		// An instrument that cannot be made is left out: refusals are
		// still answered and logged.
		s.refusals, _ = opts.MeterProvider.Meter("github.com/fencegate/fencegate/leaseapi").Int64Counter(MetricRefusals,
			metric.WithUnit("{request}"), metric.WithDescription("lease API calls refused, by client (- before one is known) and problem code"))
	}
	if s.authOn {
		s.authSum = sha256.Sum256([]byte(opts.AuthToken))
	}
	s.handler = s.routes()
	if s.telemetry {
		s.handler = instrument(s.handler, opts)
	}
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.access != nil {
		if ctx := WithClientNote(r.Context()); ctx != r.Context() {
			r = r.WithContext(ctx)
		}
	}
	s.handler.ServeHTTP(w, r)
}

// SetDraining makes /readyz answer 503 from now on, so load balancers stop
// sending new work while in-flight requests finish. API calls keep being
// served. It cannot be undone.
func (s *Server) SetDraining() { s.draining.Store(true) }

// ping checks the store within readyTimeout.
func (s *Server) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return s.store.Ping(ctx)
}
