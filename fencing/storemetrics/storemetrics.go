// Package storemetrics decorates a fencing.Store with OpenTelemetry
// telemetry: every call is timed into one histogram and traced as one span.
// It changes no behaviour: arguments, results and errors pass through
// untouched, and the decorated store is exactly as atomic as the one it
// wraps.
//
// The histogram is fencegate.store.duration (unit s, exported to Prometheus
// as fencegate_store_duration_seconds) with two attributes, both drawn from
// small fixed sets so the number of series stays bounded:
//
//   - operation: acquire, renew, release, checkpoint, read_checkpoint,
//     status, list, admit or ping (Close is not measured).
//   - outcome: ok; a refusal, named by its problem code (lease-held,
//     lease-lost, stale-token, token-not-issued, lease-not-held,
//     no-checkpoint, payload-too-large, invalid-request); a fault
//     (unavailable, ambiguous, store-lost); canceled when the caller's
//     context ended; error for anything else.
//
// Resource names are not metric attributes (they are unbounded); they are
// recorded on the span as fencegate.resource instead.
package storemetrics

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/internal/atomichist"
)

// ScopeName is the instrumentation scope of the meter and tracer.
const ScopeName = "github.com/fencegate/fencegate/fencing/storemetrics"

// MetricDuration is the name of the store latency histogram.
const MetricDuration = "fencegate.store.duration"

// Operation names, the values of the operation attribute.
const (
	OpAcquire        = "acquire"
	OpRenew          = "renew"
	OpRelease        = "release"
	OpCheckpoint     = "checkpoint"
	OpReadCheckpoint = "read_checkpoint"
	OpStatus         = "status"
	OpList           = "list"
	OpAdmit          = "admit"
	OpPing           = "ping"
)

// Outcome values besides ok and the refusal codes of fencing/problem.
const (
	OutcomeOK          = "ok"
	OutcomeUnavailable = "unavailable"
	OutcomeAmbiguous   = "ambiguous"
	OutcomeStoreLost   = "store-lost"
	OutcomeCanceled    = "canceled"
	OutcomeError       = "error"
)

// durationBuckets suit a store answering in well under a millisecond (memory)
// to tens of milliseconds (a remote Valkey), with a tail for timeouts. The
// SDK's default buckets are meant for milliseconds and would put every
// store call into the first bucket.
var durationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// refusalOutcomes are the refusal codes a store answers with (see the
// package doc). With the fault outcomes they are the outcomes whose
// attribute sets are built once, in Wrap; any other outcome still works,
// at the cost of building its set per call.
var refusalOutcomes = []string{
	"lease-held", "lease-lost", "stale-token", "token-not-issued", "lease-not-held",
	"no-checkpoint", "payload-too-large", "invalid-request",
}

// Store is a fencing.Store that records telemetry around another one. Safe
// for concurrent use when the wrapped store is.
//
// Everything a call records that does not depend on the call (span names,
// span start options, the histogram's attribute sets) is built once in
// Wrap, so that a call with a no-op tracer records its latency without
// allocating.
type Store struct {
	next   fencing.Store
	tracer trace.Tracer // nil when the provider is the no-op one: no spans

	acquire, renew, release, checkpoint, readCheckpoint, status, list, admit, ping *op
}

// op is the precomputed telemetry of one operation. Read-only after Wrap.
type op struct {
	name      string
	spanName  string
	spanStart []trace.SpanStartOption
	// record holds the histogram series per outcome.
	record map[string]atomichist.Series
	h      *atomichist.Float64
}

func newOp(h *atomichist.Float64, name string) *op {
	o := &op{
		name:     name,
		spanName: "store " + name,
		spanStart: []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("fencegate.store.operation", name)),
		},
		record: map[string]atomichist.Series{},
		h:      h,
	}
	outcomes := append([]string{OutcomeOK, OutcomeUnavailable, OutcomeAmbiguous, OutcomeStoreLost, OutcomeCanceled, OutcomeError}, refusalOutcomes...)
	for _, outcome := range outcomes {
		o.record[outcome] = o.newSeries(outcome)
	}
	return o
}

func (o *op) newSeries(outcome string) atomichist.Series {
	return o.h.Series(attribute.NewSet(attribute.String("operation", o.name), attribute.String("outcome", outcome)))
}

// series returns the histogram series of one outcome of o.
func (o *op) series(outcome string) atomichist.Series {
	if s, ok := o.record[outcome]; ok {
		return s
	}
	return o.newSeries(outcome)
}

var (
	_ fencing.Store              = (*Store)(nil)
	_ fencing.CapabilityReporter = (*Store)(nil)
	_ fencing.QuickAdmitter      = quickAdmitter{}
	_ fencing.BatchAdmitter      = batchAdmitter{}
	_ fencing.MarkReaders        = markReaders{}
	_ fencing.MarkReader         = (*markReader)(nil)
)

// Wrap returns s decorated with a latency histogram from mp (kept in
// atomics when mp is the fencegate binary's own provider, from the
// module's internal/atomichist) and a span per call from tp. A nil
// provider means no-op: nothing is recorded for it. It panics if s is
// nil. If creating the histogram fails (the SDK reports that only for an
// invalid name, which this package does not use), the histogram is a
// no-op.
func Wrap(s fencing.Store, mp metric.MeterProvider, tp trace.TracerProvider) *Store {
	if s == nil {
		panic("storemetrics: Wrap of a nil store")
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	h, err := atomichist.NewFloat64(mp, ScopeName, MetricDuration, "s",
		"Duration of fencegate lease store calls, by operation and outcome.", durationBuckets)
	if err != nil {
		h, _ = atomichist.NewFloat64(metricnoop.NewMeterProvider(), ScopeName, MetricDuration, "s", "", durationBuckets)
	}
	st := &Store{
		next:    s,
		acquire: newOp(h, OpAcquire), renew: newOp(h, OpRenew), release: newOp(h, OpRelease),
		checkpoint: newOp(h, OpCheckpoint), readCheckpoint: newOp(h, OpReadCheckpoint),
		status: newOp(h, OpStatus), list: newOp(h, OpList), admit: newOp(h, OpAdmit), ping: newOp(h, OpPing),
	}
	if r := fencing.CapabilitiesOf(s).Retain; r != nil {
		observeRetention(mp, r)
	}
	if c, ok := s.(CommitObserver); ok {
		observeCommits(mp, c)
	}
	// The no-op provider's spans record nothing and are never exported, and
	// starting one only wraps the caller's context: skipping it changes
	// nothing but the cost.
	if _, noop := tp.(tracenoop.TracerProvider); !noop {
		st.tracer = tp.Tracer(ScopeName)
	}
	return st
}

// Unwrap returns the decorated store.
func (s *Store) Unwrap() fencing.Store { return s.next }

// Outcome names the outcome of a store call for the outcome attribute: ok
// for nil, a fault kind, canceled, a refusal's problem code, or error.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, fencing.ErrStoreLost):
		return OutcomeStoreLost
	case errors.Is(err, fencing.ErrAmbiguous):
		return OutcomeAmbiguous
	case errors.Is(err, fencing.ErrUnavailable):
		return OutcomeUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return OutcomeCanceled
	}
	if code := problem.From(err).Code; code != "internal-error" {
		return code
	}
	return OutcomeError
}

// call is one measured store call.
type call struct {
	s     *Store
	op    *op
	start time.Time
	span  trace.Span // nil without a tracer
}

func (s *Store) begin(ctx context.Context, o *op, resource string) (context.Context, call) {
	return s.beginAt(ctx, o, resource, time.Time{})
}

// beginAt is begin for a call that started at start (when not zero: the
// clock is read once per call, and a quick admission costs about as much
// as a clock read).
func (s *Store) beginAt(ctx context.Context, o *op, resource string, start time.Time) (context.Context, call) {
	c := call{s: s, op: o, start: start}
	if s.tracer != nil {
		opts := o.spanStart
		if resource != "" {
			opts = append(opts[:len(opts):len(opts)], trace.WithAttributes(attribute.String("fencegate.resource", resource)))
		}
		ctx, c.span = s.tracer.Start(ctx, o.spanName, opts...)
	}
	if c.start.IsZero() {
		c.start = time.Now()
	}
	return ctx, c
}

// end records the call (a canceled caller's too).
func (c call) end(ctx context.Context, err error) {
	elapsed := time.Since(c.start).Seconds()
	outcome := Outcome(err)
	c.op.series(outcome).Record(elapsed)
	if c.span == nil {
		return
	}
	c.span.SetAttributes(attribute.String("fencegate.store.outcome", outcome))
	switch outcome {
	case OutcomeOK:
	case OutcomeUnavailable, OutcomeAmbiguous, OutcomeStoreLost, OutcomeError, OutcomeCanceled:
		// A fault or an unexpected error: the call failed. Refusals are
		// definite answers, not failures, and leave the status unset.
		c.span.RecordError(err)
		c.span.SetStatus(codes.Error, outcome)
	}
	c.span.End()
}

// Acquire times and traces the wrapped store's Acquire.
func (s *Store) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	ctx, c := s.begin(ctx, s.acquire, req.Resource)
	l, err := s.next.Acquire(ctx, req)
	c.end(ctx, err)
	return l, err
}

// Renew times and traces the wrapped store's Renew.
func (s *Store) Renew(ctx context.Context, req fencing.RenewRequest) (fencing.Lease, error) {
	ctx, c := s.begin(ctx, s.renew, req.Resource)
	l, err := s.next.Renew(ctx, req)
	c.end(ctx, err)
	return l, err
}

// Release times and traces the wrapped store's Release.
func (s *Store) Release(ctx context.Context, req fencing.ReleaseRequest) (bool, error) {
	ctx, c := s.begin(ctx, s.release, req.Resource)
	ok, err := s.next.Release(ctx, req)
	c.end(ctx, err)
	return ok, err
}

// Checkpoint times and traces the wrapped store's Checkpoint.
func (s *Store) Checkpoint(ctx context.Context, req fencing.CheckpointRequest) (fencing.Lease, error) {
	ctx, c := s.begin(ctx, s.checkpoint, req.Resource)
	l, err := s.next.Checkpoint(ctx, req)
	c.end(ctx, err)
	return l, err
}

// ReadCheckpoint times and traces the wrapped store's ReadCheckpoint.
func (s *Store) ReadCheckpoint(ctx context.Context, resource string) (fencing.Checkpoint, error) {
	ctx, c := s.begin(ctx, s.readCheckpoint, resource)
	cp, err := s.next.ReadCheckpoint(ctx, resource)
	c.end(ctx, err)
	return cp, err
}

// Status times and traces the wrapped store's Status.
func (s *Store) Status(ctx context.Context, resource string) (fencing.Status, error) {
	ctx, c := s.begin(ctx, s.status, resource)
	st, err := s.next.Status(ctx, resource)
	c.end(ctx, err)
	return st, err
}

// List times and traces the wrapped store's List.
func (s *Store) List(ctx context.Context, req fencing.ListRequest) ([]fencing.Lease, error) {
	ctx, c := s.begin(ctx, s.list, "")
	ls, err := s.next.List(ctx, req)
	c.end(ctx, err)
	return ls, err
}

// Admit times and traces the wrapped store's Admit.
func (s *Store) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	ctx, c := s.begin(ctx, s.admit, req.Resource)
	a, err := s.next.Admit(ctx, req)
	c.end(ctx, err)
	return a, err
}

// Capabilities reports the wrapped store's capabilities
// (fencing.CapabilitiesOf), with those that admit measured like Admit:
// nil where the wrapped store has none. Retention, holds and the shared
// barrier are the wrapped store's own, unmeasured.
func (s *Store) Capabilities() fencing.Capabilities {
	c := fencing.CapabilitiesOf(s.next)
	if c.Quick != nil {
		c.Quick = quickAdmitter{s: s, next: c.Quick}
	}
	if c.Batch != nil {
		c.Batch = batchAdmitter{s: s, next: c.Batch}
	}
	if c.Marks != nil {
		c.Marks = markReaders{s: s, next: c.Marks}
	}
	return c
}

// quickAdmitter measures a wrapped fencing.QuickAdmitter.
type quickAdmitter struct {
	s    *Store
	next fencing.QuickAdmitter
}

// AdmitNow times and traces the wrapped AdmitNow. An answer is measured
// as an Admit; a false one is not measured (Admit follows).
func (q quickAdmitter) AdmitNow(req fencing.AdmitRequest) (fencing.Admission, bool) {
	start := time.Now()
	a, ok := q.next.AdmitNow(req)
	if ok {
		ctx, c := q.s.beginAt(context.Background(), q.s.admit, req.Resource, start)
		c.end(ctx, nil)
	}
	return a, ok
}

// batchAdmitter measures a wrapped fencing.BatchAdmitter.
type batchAdmitter struct {
	s    *Store
	next fencing.BatchAdmitter
}

// AdmitBatch times and traces the wrapped AdmitBatch, each admission
// measured as an Admit lasting the whole batch.
func (b batchAdmitter) AdmitBatch(ctx context.Context, reqs []fencing.AdmitRequest, out []fencing.Admission, errs []error) {
	start := time.Now()
	b.next.AdmitBatch(ctx, reqs, out, errs)
	for i := range reqs {
		cctx, c := b.s.beginAt(ctx, b.s.admit, reqs[i].Resource, start)
		c.end(cctx, errs[i])
	}
}

// markReaders measures the readers of a wrapped fencing.MarkReaders.
type markReaders struct {
	s    *Store
	next fencing.MarkReaders
}

// OpenMarkReader opens one of the wrapped mark readers. Each admission a
// reader settles is measured as an Admit lasting from Send to the answer
// that completed its batch; the others are measured where they are
// admitted.
func (m markReaders) OpenMarkReader(ctx context.Context) (fencing.MarkReader, error) {
	r, err := m.next.OpenMarkReader(ctx)
	if err != nil || r == nil {
		return nil, err
	}
	return &markReader{MarkReader: r, s: m.s}, nil
}

// markReader measures the admissions a wrapped fencing.MarkReader settles.
type markReader struct {
	fencing.MarkReader
	s     *Store
	reqs  []fencing.AdmitRequest
	start time.Time
}

func (r *markReader) Send(now time.Time, reqs []fencing.AdmitRequest) (bool, error) {
	r.reqs, r.start = reqs, time.Now()
	return r.MarkReader.Send(now, reqs)
}

func (r *markReader) Receive(out []fencing.Admission, settled []bool) (bool, error) {
	done, err := r.MarkReader.Receive(out, settled)
	if done {
		for i, req := range r.reqs {
			if settled[i] {
				ctx, c := r.s.beginAt(context.Background(), r.s.admit, req.Resource, r.start)
				c.end(ctx, nil)
			}
		}
		r.reqs = nil
	}
	return done, err
}

// Ping times and traces the wrapped store's Ping.
func (s *Store) Ping(ctx context.Context) error {
	ctx, c := s.begin(ctx, s.ping, "")
	err := s.next.Ping(ctx)
	c.end(ctx, err)
	return err
}

// Close closes the wrapped store; it is not measured.
func (s *Store) Close() error { return s.next.Close() }
