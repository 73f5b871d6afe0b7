// Package atomichist keeps explicit-bucket histograms in atomic counters
// and hands them to OpenTelemetry readers as a metric producer
// (sdkmetric.Producer), for measurements taken on every request.
//
// The SDK's synchronous histogram normalizes the attribute set, looks up its
// series and takes the series' lock on every measurement: about 250 ns,
// twice per write through the gate, on the event loop's thread. A series
// here is looked up once by its user and recorded with a few atomic
// additions.
//
// A MeterProvider carries a Producer to the packages that measure:
// NewFloat64 makes an atomic histogram when it is given one, and the
// provider's own SDK histogram otherwise (a plain provider, as in tests),
// with the same name, unit, description, bounds and attributes. The
// Producer must be registered on every reader of the provider
// (sdkmetric.WithProducer, or the Prometheus exporter's WithProducer).
//
// Limits: the data is always cumulative, from the Producer's creation (a
// reader asking for delta temporality gets cumulative points), and has no
// exemplars. A point is read without stopping measurements: its count is
// the sum of its buckets, its sum may include a measurement its buckets
// do not have yet.
package atomichist

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Producer holds histograms and reports them to readers. Safe for
// concurrent use.
type Producer struct {
	start time.Time
	mu    sync.Mutex
	hists []*histogram
}

var _ sdkmetric.Producer = (*Producer)(nil)

// NewProducer returns an empty Producer; its points start now.
func NewProducer() *Producer { return &Producer{start: time.Now()} }

// MeterProvider is an SDK MeterProvider whose readers also read
// Histograms.
type MeterProvider struct {
	*sdkmetric.MeterProvider
	Histograms *Producer
}

// Float64 is a histogram instrument: atomic, or the SDK's.
type Float64 struct {
	fast *histogram
	sdk  metric.Float64Histogram
}

// NewFloat64 returns the histogram name of scope from mp: an atomic one
// when mp is a *MeterProvider, the SDK's otherwise. bounds must be
// ascending.
func NewFloat64(mp metric.MeterProvider, scope, name, unit, description string, bounds []float64) (*Float64, error) {
	if p, ok := mp.(*MeterProvider); ok && p.Histograms != nil {
		return &Float64{fast: p.Histograms.add(scope, name, unit, description, bounds)}, nil
	}
	h, err := mp.Meter(scope).Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(description),
		metric.WithExplicitBucketBoundaries(bounds...))
	if err != nil {
		return nil, err
	}
	return &Float64{sdk: h}, nil
}

// Series returns the recorder of one attribute set. Look it up once and
// keep it: this takes a lock.
func (h *Float64) Series(attrs attribute.Set) Series {
	if h.fast != nil {
		return Series{fast: h.fast.series(attrs)}
	}
	return Series{sdk: h.sdk, opts: []metric.RecordOption{metric.WithAttributeSet(attrs)}}
}

// Series is one attribute set of a Float64.
type Series struct {
	fast *series
	sdk  metric.Float64Histogram
	opts []metric.RecordOption
}

// Record adds one measurement. The zero Series records nothing.
func (s Series) Record(v float64) {
	switch {
	case s.fast != nil:
		s.fast.record(v)
	case s.sdk != nil:
		s.sdk.Record(context.Background(), v, s.opts...)
	}
}

// histogram is one instrument of a Producer.
type histogram struct {
	scope, name, unit, desc string
	bounds                  []float64
	mu                      sync.RWMutex
	byAttrs                 map[attribute.Distinct]*series
	order                   []*series // creation order
}

func (p *Producer) add(scope, name, unit, desc string, bounds []float64) *histogram {
	h := &histogram{scope: scope, name: name, unit: unit, desc: desc, bounds: append([]float64(nil), bounds...),
		byAttrs: make(map[attribute.Distinct]*series)}
	p.mu.Lock()
	p.hists = append(p.hists, h)
	p.mu.Unlock()
	return h
}

func (h *histogram) series(attrs attribute.Set) *series {
	key := attrs.Equivalent()
	h.mu.RLock()
	s := h.byAttrs[key]
	h.mu.RUnlock()
	if s != nil {
		return s
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if s = h.byAttrs[key]; s == nil {
		s = &series{attrs: attrs, bounds: h.bounds, counts: make([]atomic.Uint64, len(h.bounds)+1)}
		s.min.Store(math.Float64bits(math.Inf(1)))
		s.max.Store(math.Float64bits(math.Inf(-1)))
		h.byAttrs[key] = s
		h.order = append(h.order, s)
	}
	return s
}

// series is one attribute set's counts. Bucket i counts the measurements
// in (bounds[i-1], bounds[i]]; the last one those above every bound.
type series struct {
	attrs    attribute.Set
	bounds   []float64
	counts   []atomic.Uint64
	sum      atomic.Uint64 // float64 bits
	min, max atomic.Uint64 // float64 bits
}

// record adds v: its sum, minimum and maximum first, so a point whose
// count includes v has them too.
func (s *series) record(v float64) {
	update(&s.sum, func(cur float64) float64 { return cur + v })
	update(&s.min, func(cur float64) float64 { return math.Min(cur, v) })
	update(&s.max, func(cur float64) float64 { return math.Max(cur, v) })
	s.counts[sort.SearchFloat64s(s.bounds, v)].Add(1)
}

// update replaces the float64 in a with f of it, unless unchanged.
func update(a *atomic.Uint64, f func(float64) float64) {
	for {
		old := a.Load()
		nv := math.Float64bits(f(math.Float64frombits(old)))
		if nv == old || a.CompareAndSwap(old, nv) {
			return
		}
	}
}

// Produce implements sdkmetric.Producer: every histogram with at least
// one series, grouped by scope.
func (p *Producer) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	now := time.Now()
	p.mu.Lock()
	hists := p.hists
	p.mu.Unlock()
	var out []metricdata.ScopeMetrics
	for _, h := range hists {
		h.mu.RLock()
		order := h.order
		h.mu.RUnlock()
		if len(order) == 0 {
			continue
		}
		points := make([]metricdata.HistogramDataPoint[float64], 0, len(order))
		for _, s := range order {
			pt := metricdata.HistogramDataPoint[float64]{Attributes: s.attrs, StartTime: p.start, Time: now,
				Bounds: h.bounds, BucketCounts: make([]uint64, len(s.counts))}
			for i := range s.counts {
				pt.BucketCounts[i] = s.counts[i].Load()
				pt.Count += pt.BucketCounts[i]
			}
			if pt.Count == 0 {
				continue
			}
			pt.Sum = math.Float64frombits(s.sum.Load())
			pt.Min = metricdata.NewExtrema(math.Float64frombits(s.min.Load()))
			pt.Max = metricdata.NewExtrema(math.Float64frombits(s.max.Load()))
			points = append(points, pt)
		}
		if len(points) == 0 {
			continue
		}
		m := metricdata.Metrics{Name: h.name, Description: h.desc, Unit: h.unit,
			Data: metricdata.Histogram[float64]{DataPoints: points, Temporality: metricdata.CumulativeTemporality}}
		i := 0
		for i < len(out) && out[i].Scope.Name != h.scope {
			i++
		}
		if i == len(out) {
			out = append(out, metricdata.ScopeMetrics{Scope: instrumentation.Scope{Name: h.scope}})
		}
		out[i].Metrics = append(out[i].Metrics, m)
	}
	return out, nil
}
