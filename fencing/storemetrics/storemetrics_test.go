package storemetrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/storemetrics"
)

// counts collects the histogram's sample count per "operation/outcome".
func counts(t *testing.T, r *sdkmetric.ManualReader) map[string]uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != storemetrics.MetricDuration {
				continue
			}
			if m.Unit != "s" {
				t.Errorf("unit %q, want s", m.Unit)
			}
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				t.Fatalf("%s is %T, want a float64 histogram", m.Name, m.Data)
			}
			for _, dp := range h.DataPoints {
				op, _ := dp.Attributes.Value("operation")
				out, _ := dp.Attributes.Value("outcome")
				if dp.Attributes.Len() != 2 {
					t.Errorf("data point has attributes %v; want only operation and outcome", dp.Attributes.ToSlice())
				}
				got[op.AsString()+"/"+out.AsString()] += dp.Count
			}
		}
	}
	return got
}

func TestHistogramCountsCallsByOperationAndOutcome(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	mem := memstore.New(memstore.Options{})
	var s fencing.Store = storemetrics.Wrap(mem, mp, tp)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	refused := func(err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("got %v, want %v", err, want)
		}
	}

	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "a", TTL: time.Minute})
	must(err)
	_, err = s.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "a", TTL: time.Minute})
	must(err)
	_, err = s.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "b", TTL: time.Minute})
	refused(err, fencing.ErrLeaseHeld)
	_, err = s.Acquire(ctx, fencing.AcquireRequest{Resource: "", Owner: "b", TTL: time.Minute})
	refused(err, fencing.ErrInvalid)
	_, err = s.Renew(ctx, fencing.RenewRequest{Resource: "job:1", Owner: "a", Token: l.Token})
	must(err)
	_, err = s.Renew(ctx, fencing.RenewRequest{Resource: "job:1", Owner: "b", Token: l.Token})
	refused(err, fencing.ErrLeaseLost)
	_, err = s.ReadCheckpoint(ctx, "job:1")
	refused(err, fencing.ErrNoCheckpoint)
	_, err = s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: "job:1", Owner: "a", Token: l.Token, State: json.RawMessage(`{"step":1}`)})
	must(err)
	_, err = s.ReadCheckpoint(ctx, "job:1")
	must(err)
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: "job:1", Token: l.Token})
	must(err)
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: "job:1", Token: l.Token + 1})
	refused(err, fencing.ErrTokenNotIssued)
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: "job:1", Token: l.Token, RequireLive: true})
	must(err)
	_, err = s.Status(ctx, "job:1")
	must(err)
	_, err = s.List(ctx, fencing.ListRequest{Limit: 10})
	must(err)
	released, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "job:1", Owner: "a", Token: l.Token})
	must(err)
	if !released {
		t.Fatal("release reported false")
	}
	l2, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "b", TTL: time.Minute})
	must(err)
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: "job:1", Token: l2.Token})
	must(err)
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: "job:1", Token: l.Token})
	refused(err, fencing.ErrStaleToken)
	must(s.Ping(ctx))
	// A closed memory store answers ErrUnavailable: a real fault.
	must(s.Close())
	refused(s.Ping(ctx), fencing.ErrUnavailable)
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: "job:1", Token: l2.Token})
	refused(err, fencing.ErrUnavailable)

	want := map[string]uint64{
		"acquire/ok":                    3,
		"acquire/lease-held":            1,
		"acquire/invalid-request":       1,
		"renew/ok":                      1,
		"renew/lease-lost":              1,
		"read_checkpoint/no-checkpoint": 1,
		"read_checkpoint/ok":            1,
		"checkpoint/ok":                 1,
		"admit/ok":                      3,
		"admit/token-not-issued":        1,
		"admit/stale-token":             1,
		"admit/unavailable":             1,
		"status/ok":                     1,
		"list/ok":                       1,
		"release/ok":                    1,
		"ping/ok":                       1,
		"ping/unavailable":              1,
	}
	got := counts(t, reader)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("histogram counts\n got %v\nwant %v", got, want)
	}

	// One span per call, closed, named after the operation; faults are
	// errors, refusals are not.
	ended := spans.Ended()
	var total uint64
	for _, n := range want {
		total += n
	}
	if uint64(len(ended)) != total {
		t.Fatalf("%d spans, want %d", len(ended), total)
	}
	errSpans := 0
	for _, sp := range ended {
		if sp.Status().Code.String() == "Error" {
			errSpans++
		}
	}
	if errSpans != 2 {
		t.Fatalf("%d spans with error status, want 2 (the two unavailable calls)", errSpans)
	}
	if ended[0].Name() != "store acquire" {
		t.Fatalf("first span %q, want %q", ended[0].Name(), "store acquire")
	}
}

func TestOutcome(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{fmt.Errorf("x: %w", fencing.ErrAmbiguous), "ambiguous"},
		{fencing.ErrUnavailable, "unavailable"},
		{fencing.ErrStoreLost, "store-lost"},
		{context.Canceled, "canceled"},
		{&fencing.StaleTokenError{Resource: "r", Token: 1, HighWater: 2}, "stale-token"},
		{fencing.ErrLeaseNotHeld, "lease-not-held"},
		{&fencing.TooLargeError{Size: 2, Limit: 1}, "payload-too-large"},
		{errors.New("boom"), "error"},
	} {
		if got := storemetrics.Outcome(c.err); got != c.want {
			t.Errorf("Outcome(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestNilProvidersRecordNothingAndPassThrough(t *testing.T) {
	mem := memstore.New(memstore.Options{})
	s := storemetrics.Wrap(mem, nil, nil)
	if s.Unwrap() != fencing.Store(mem) {
		t.Fatal("Unwrap does not return the wrapped store")
	}
	l, err := s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "r", Owner: "o", TTL: time.Second})
	if err != nil || l.Token != 1 {
		t.Fatalf("acquire through the decorator: %v %v", l, err)
	}
	st, err := mem.Status(context.Background(), "r")
	if err != nil || st.Issued != 1 {
		t.Fatalf("the wrapped store did not see the acquire: %+v %v", st, err)
	}
}

// TestConformance runs the store conformance suite through the decorator,
// with real SDK providers recording, to show it changes no behaviour.
func TestConformance(t *testing.T) {
	fencingtest.Run(t, fencingtest.Harness{
		MaxCheckpointBytes: 4 << 10,
		Open: func(t testing.TB) fencingtest.Instance {
			clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
			mem := memstore.New(memstore.Options{Clock: clock, MaxCheckpointBytes: 4 << 10})
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
			st := storemetrics.Wrap(mem, mp, tp)
			t.Cleanup(func() { st.Close() })
			return fencingtest.Instance{Store: st, Advance: clock.Advance}
		},
	})
}

// TestAdmitAtTheMarkAllocatesNothing: with the SDK's histogram recording
// and no tracer (how fencegate runs without an OTLP endpoint), the decorator
// adds no allocation to the memory store's admission at the mark.
func TestAdmitAtTheMarkAllocatesNothing(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	st := storemetrics.Wrap(memstore.New(memstore.Options{}), mp, tracenoop.NewTracerProvider())
	defer st.Close()
	fencingtest.CheckAdmitAtTheMarkAllocs(t, st)
}

// BenchmarkAdmitAtTheMark measures the decorator around the memory store's
// admission at the mark: bare, with no-op providers, with the SDK's
// histogram and no tracer (fencegate without OTLP), and with every call
// traced and sampled.
func BenchmarkAdmitAtTheMark(b *testing.B) {
	sdkMeter := func() *sdkmetric.MeterProvider {
		return sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	}
	cases := []struct {
		name string
		wrap func(fencing.Store) fencing.Store
	}{
		{"bare", func(s fencing.Store) fencing.Store { return s }},
		{"noop", func(s fencing.Store) fencing.Store { return storemetrics.Wrap(s, nil, nil) }},
		{"metrics", func(s fencing.Store) fencing.Store {
			return storemetrics.Wrap(s, sdkMeter(), tracenoop.NewTracerProvider())
		}},
		{"metrics+traced", func(s fencing.Store) fencing.Store {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
			return storemetrics.Wrap(s, sdkMeter(), tp)
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			st := c.wrap(memstore.New(memstore.Options{}))
			defer st.Close()
			ctx := context.Background()
			l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "a", TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			req := fencing.AdmitRequest{Resource: "job:1", Token: l.Token}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := st.Admit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestQuickAdmit: the decorator forwards AdmitNow to a store that has it,
// measures an answer as an admit, and admits nothing at once for a store
// without it.
func TestQuickAdmit(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	st := storemetrics.Wrap(memstore.New(memstore.Options{}), mp, tracenoop.NewTracerProvider())
	fencingtest.CheckQuickAdmit(t, st, true)
	if got := counts(t, reader)["admit/ok"]; got != 3 { // the raise and the mark at once, and one Admit
		t.Fatalf("admit/ok counted %d times, want 3", got)
	}
	plain := storemetrics.Wrap(struct{ fencing.Store }{memstore.New(memstore.Options{})}, mp, nil)
	ctx := context.Background()
	l, err := plain.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	if q := fencing.CapabilitiesOf(plain).Quick; q != nil {
		t.Fatalf("a store without AdmitNow reported through the decorator as a QuickAdmitter: %T", q)
	}
}

// batching is a memory store with a batch path (one Admit after another),
// for the decorator's AdmitBatch.
type batching struct{ *memstore.Store }

func (b batching) AdmitBatch(ctx context.Context, reqs []fencing.AdmitRequest, out []fencing.Admission, errs []error) {
	for i := range reqs {
		out[i], errs[i] = b.Admit(ctx, reqs[i])
	}
}

func TestBatchAdmit(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	st := storemetrics.Wrap(batching{memstore.New(memstore.Options{})}, mp, tracenoop.NewTracerProvider())
	before := counts(t, reader)
	fencingtest.CheckBatchAdmit(t, st)
	after := counts(t, reader)
	// The check sends one batch of 9 (4 admitted, 5 refused) and Admits
	// each request again; every answer of the batch is measured.
	if ok := after["admit/ok"] - before["admit/ok"]; ok != 2+4+4 { // 2 Admits setting up, 4 in the batch, 4 after
		t.Fatalf("admit/ok counted %d times, want 10", ok)
	}
	plain := storemetrics.Wrap(memstore.New(memstore.Options{}), mp, nil)
	if b := fencing.CapabilitiesOf(plain).Batch; b != nil {
		t.Fatalf("a store without AdmitBatch reported through the decorator as a BatchAdmitter: %T", b)
	}
}

// marking is a store with mark readers that settle every other request.
type marking struct{ *memstore.Store }

func (marking) OpenMarkReader(context.Context) (fencing.MarkReader, error) { return &evenReader{}, nil }

type evenReader struct{ n int }

func (r *evenReader) Fd() int { return -1 }
func (r *evenReader) Send(_ time.Time, reqs []fencing.AdmitRequest) (bool, error) {
	r.n = len(reqs)
	return false, nil
}
func (r *evenReader) Flush() (bool, error) { return false, nil }
func (r *evenReader) Awaiting() bool       { return false }
func (r *evenReader) Receive(out []fencing.Admission, settled []bool) (bool, error) {
	for i := range r.n {
		settled[i] = i%2 == 0
	}
	return true, nil
}
func (r *evenReader) Overdue(time.Time) bool { return false }
func (r *evenReader) Close() error           { return nil }

// TestMarkReader: each admission a mark reader settles is measured as an
// admit; the others are not (they are measured where they are admitted).
// A store without mark readers opens none.
func TestMarkReader(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	st := storemetrics.Wrap(marking{memstore.New(memstore.Options{})}, mp, tracenoop.NewTracerProvider())
	r, err := fencing.CapabilitiesOf(st).Marks.OpenMarkReader(context.Background())
	if err != nil || r == nil {
		t.Fatalf("OpenMarkReader: %v, %v", r, err)
	}
	before := counts(t, reader)
	reqs := make([]fencing.AdmitRequest, 5)
	if _, err := r.Send(time.Now(), reqs); err != nil {
		t.Fatal(err)
	}
	if done, err := r.Receive(make([]fencing.Admission, 5), make([]bool, 5)); !done || err != nil {
		t.Fatalf("Receive: %v, %v", done, err)
	}
	if got := counts(t, reader)["admit/ok"] - before["admit/ok"]; got != 3 {
		t.Fatalf("admit/ok counted %d times for 3 settled admissions", got)
	}
	plain := storemetrics.Wrap(memstore.New(memstore.Options{}), mp, nil)
	if m := fencing.CapabilitiesOf(plain).Marks; m != nil {
		t.Fatalf("a store without mark readers reported through the decorator as MarkReaders: %T", m)
	}
}

// TestRetentionCounters: a store that removes idle records reports what
// its sweeps did through the wrapper's meter.
func TestRetentionCounters(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := memstore.New(memstore.Options{Clock: clock, ClockTokens: true, Retention: time.Hour, SweepInterval: 24 * time.Hour})
	defer mem.Close()
	st := storemetrics.Wrap(mem, mp, nil)
	ctx := context.Background()
	for _, res := range []string{"a", "b"} {
		l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "o", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "o", Token: l.Token}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(2 * time.Hour)
	if n, err := mem.Sweep(ctx); err != nil || n != 2 {
		t.Fatalf("Sweep = %d, %v; want 2 removed", n, err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					got[m.Name] += float64(dp.Value)
				}
			case metricdata.Sum[float64]:
				for _, dp := range d.DataPoints {
					got[m.Name] += dp.Value
				}
			}
		}
	}
	if got[storemetrics.MetricRetentionRemoved] != 2 || got[storemetrics.MetricRetentionSweeps] != 1 {
		t.Fatalf("retention counters %v, want 2 removed in 1 sweep", got)
	}
	if _, ok := got[storemetrics.MetricRetentionSweepTime]; !ok {
		t.Fatalf("no %s in %v", storemetrics.MetricRetentionSweepTime, got)
	}
}
