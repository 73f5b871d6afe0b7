package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/barrier"
)

// Metrics of the shared barrier (Options.SharedBarrier), exported to
// Prometheus as fencegate_gate_shared_barrier_waits_total,
// fencegate_gate_shared_barrier_wait_duration_seconds and
// fencegate_gate_shared_barrier_expired_total.
const (
	// MetricSharedWaits counts admitted writes that found a lower-token
	// write in flight (through any gate) and had to wait, by outcome:
	// passed, timeout, client-gone or store-unavailable.
	MetricSharedWaits = "fencegate.gate.shared_barrier.waits"
	// MetricSharedWaitDuration is how long those writes waited.
	MetricSharedWaitDuration = "fencegate.gate.shared_barrier.wait.duration"
	// MetricSharedExpired counts entries this gate found past their
	// deadline and removed: writes of a gate that crashed, or whose
	// outcome was ambiguous, or whose removal failed.
	MetricSharedExpired = "fencegate.gate.shared_barrier.expired"
)

// attrOutcome is the outcome attribute of MetricSharedWaits and
// MetricSharedWaitDuration.
var attrOutcome = attribute.Key("outcome")

// sharedOrder orders writes across every gate on one store
// (Options.SharedBarrier). An entry lives for hold: the longest a write
// may wait at the barrier, then be forwarded and answered, then (if its
// outcome was not seen) still be applied by the upstream.
type sharedOrder struct {
	sb      fencing.SharedBarrier
	gateID  string
	hold    time.Duration
	waits   metric.Int64Counter
	waitDur metric.Float64Histogram
	expired metric.Int64Counter
	leaves  *leaver // removes the entries of ended writes, retrying failures
}

// sharedWaitBuckets are the shared barrier's wait histogram's bounds, in
// seconds: from a store round trip to past the longest barrier timeout
// one would set (the SDK's defaults are made for milliseconds, and would
// put every wait under 5 s in one bucket).
var sharedWaitBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

func newSharedOrder(sb fencing.SharedBarrier, opts Options, log *slog.Logger, barrierTimeout, grace time.Duration) (*sharedOrder, error) {
	if opts.GateID == "" {
		return nil, errors.New("proxy: GateID is required with SharedBarrier")
	}
	ut := opts.UpstreamTimeout
	if ut == 0 {
		ut = DefaultUpstreamTimeout
	}
	o := &sharedOrder{sb: sb, gateID: opts.GateID, hold: barrierTimeout + ut + max(grace, 0)}
	var m metric.Meter = metricnoop.Meter{}
	if opts.MeterProvider != nil {
		m = opts.MeterProvider.Meter(ScopeName)
	}
	var err1, err2, err3 error
	o.waits, err1 = m.Int64Counter(MetricSharedWaits, metric.WithUnit("{write}"),
		metric.WithDescription("Admitted writes that waited behind a lower-token write in flight through any gate, by outcome."))
	o.waitDur, err2 = m.Float64Histogram(MetricSharedWaitDuration, metric.WithUnit("s"),
		metric.WithDescription("How long admitted writes waited at the shared barrier."),
		metric.WithExplicitBucketBoundaries(sharedWaitBuckets...))
	o.expired, err3 = m.Int64Counter(MetricSharedExpired, metric.WithUnit("{entry}"),
		metric.WithDescription("Shared-barrier entries removed at their deadline (a gate crashed, an outcome was ambiguous, or a removal failed)."))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("proxy: creating the shared barrier's metrics: %w", err)
	}
	var err error
	if o.leaves, err = newLeaver(sb, log, m); err != nil {
		return nil, err
	}
	return o, nil
}

// admit admits and registers the write on target in one atomic store
// step.
func (o *sharedOrder) admit(ctx context.Context, target Target) (flight, fencing.Admission, error) {
	adm, e, lower, err := o.sb.AdmitRegister(ctx, fencing.AdmitRequest{Resource: target.Resource, Token: target.Token, RequireLive: target.Strict}, o.gateID, o.hold)
	if err != nil {
		return nil, adm, err
	}
	// The store set the entry's deadline hold after its clock's reading,
	// taken before this answer: hold from now ends no earlier.
	until := time.Now().Add(o.hold)
	o.countExpired(ctx, e.Expired)
	return &sharedFlight{o: o, entry: e, until: until, lower: lower}, adm, nil
}

// close stops retrying removals and waits for those in progress, until
// ctx ends (see leaver.close).
func (o *sharedOrder) close(ctx context.Context) error { return o.leaves.close(ctx) }

// heldUntil is unknown to this gate: the entries may be another gate's.
func (o *sharedOrder) heldUntil(Target) time.Time { return time.Time{} }

func (o *sharedOrder) countExpired(ctx context.Context, n int) {
	if n > 0 {
		o.expired.Add(context.WithoutCancel(ctx), int64(n))
	}
}

// sharedFlight is one write's entry in the shared barrier.
type sharedFlight struct {
	o     *sharedOrder
	entry fencing.BarrierEntry
	until time.Time // the entry's lifetime has passed, by this host's clock
	lower bool      // a lower-token entry existed at admission
	once  sync.Once
}

// Wait waits only when the admission saw a lower-token entry. A store
// fault fails closed: the error matches it and the write is not forwarded.
func (f *sharedFlight) Wait(ctx context.Context, timeout time.Duration) error {
	if !f.lower {
		return nil
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	expired, err := f.o.sb.WaitLower(wctx, f.entry)
	f.o.countExpired(ctx, expired)
	outcome := "passed"
	switch {
	case err == nil:
	case ctx.Err() != nil:
		outcome, err = CodeClientGone, ctx.Err()
	case wctx.Err() != nil:
		outcome, err = "timeout", barrier.ErrTimeout
	default:
		outcome = "store-unavailable"
	}
	bg := context.WithoutCancel(ctx)
	attrs := metric.WithAttributes(attrOutcome.String(outcome))
	f.o.waits.Add(bg, 1, attrs)
	f.o.waitDur.Record(bg, time.Since(start).Seconds(), attrs)
	return err
}

// Leave removes the entry in the background: the response does not wait
// for it. A removal that fails is retried until the entry's lifetime
// passes (see leaver).
func (f *sharedFlight) Leave() {
	f.once.Do(func() { f.o.leaves.leave(f.entry, f.until) })
}

// Hold keeps the entry until its deadline, which covers the grace: the
// outcome of a forwarded write was not seen. Hold(d <= 0) is Leave.
func (f *sharedFlight) Hold(d time.Duration) {
	if d <= 0 {
		f.Leave()
		return
	}
	f.once.Do(func() {})
}
