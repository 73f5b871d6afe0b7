package atomichist

import (
	"context"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
)

var bounds = []float64{0.01, 0.1, 1}

// collect reads everything reader has.
func collect(t *testing.T, reader *sdkmetric.ManualReader) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// record makes histogram "h" of scope "s" on mp and records the same
// measurements in two series.
func record(t *testing.T, mp metric.MeterProvider) {
	t.Helper()
	h, err := NewFloat64(mp, "s", "h", "s", "a histogram", bounds)
	if err != nil {
		t.Fatal(err)
	}
	a := h.Series(attribute.NewSet(attribute.String("k", "a"), attribute.Int("n", 1)))
	b := h.Series(attribute.NewSet(attribute.String("k", "b")))
	h.Series(attribute.NewSet(attribute.String("k", "never"))) // no measurement: no point
	for _, v := range []float64{0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 0} {
		a.Record(v)
	}
	b.Record(0.25)
}

// TestSameDataAsTheSDK: the atomic histogram exports what the SDK's exports
// for the same measurements (bucket bounds upper-inclusive, count, sum,
// min, max, attributes, scope, name, unit, description).
func TestSameDataAsTheSDK(t *testing.T) {
	sdkReader := sdkmetric.NewManualReader()
	record(t, sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkReader)))

	p := NewProducer()
	fastReader := sdkmetric.NewManualReader(sdkmetric.WithProducer(p))
	record(t, &MeterProvider{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(fastReader)), Histograms: p})

	want, got := collect(t, sdkReader), collect(t, fastReader)
	if len(want.ScopeMetrics) != 1 || len(got.ScopeMetrics) != 1 {
		t.Fatalf("scopes: SDK %d, atomic %d; want 1 each", len(want.ScopeMetrics), len(got.ScopeMetrics))
	}
	metricdatatest.AssertEqual(t, want.ScopeMetrics[0], got.ScopeMetrics[0], metricdatatest.IgnoreTimestamp())
	pts := got.ScopeMetrics[0].Metrics[0].Data.(metricdata.Histogram[float64]).DataPoints
	for _, pt := range pts {
		if k, _ := pt.Attributes.Value("k"); k.AsString() == "a" {
			// 0.005 0.01 0 | 0.05 0.1 | 0.5 1 | 2
			if got := pt.BucketCounts; len(got) != 4 || got[0] != 3 || got[1] != 2 || got[2] != 2 || got[3] != 1 {
				t.Fatalf("bucket counts %v, want [3 2 2 1]", got)
			}
		}
	}
}

// TestConcurrentRecords: measurements from many goroutines are all counted
// and summed.
func TestConcurrentRecords(t *testing.T) {
	p := NewProducer()
	h, err := NewFloat64(&MeterProvider{MeterProvider: sdkmetric.NewMeterProvider(), Histograms: p}, "s", "h", "s", "", bounds)
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 32, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			s := h.Series(attribute.NewSet(attribute.Int("g", g%4)))
			for i := range each {
				s.Record(float64(i%4) * 0.5) // 0, 0.5, 1, 1.5: sums are exact
			}
		})
	}
	wg.Wait()
	sm, err := p.Produce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var count uint64
	var sum float64
	for _, pt := range sm[0].Metrics[0].Data.(metricdata.Histogram[float64]).DataPoints {
		count += pt.Count
		sum += pt.Sum
		if mx, _ := pt.Max.Value(); mx != 1.5 {
			t.Fatalf("max %v, want 1.5", mx)
		}
	}
	if count != goroutines*each || sum != goroutines*each/4*3 {
		t.Fatalf("count %d, sum %v; want %d and %d", count, sum, goroutines*each, goroutines*each/4*3)
	}
}

func BenchmarkRecord(b *testing.B) {
	attrs := attribute.NewSet(attribute.String("http.request.method", "PUT"), attribute.Int("http.response.status_code", 200),
		attribute.String("http.route", "/jobs/{id}"), attribute.String("url.scheme", "http"))
	for _, c := range []struct {
		name string
		mp   metric.MeterProvider
	}{
		{"sdk", sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))},
		{"atomic", &MeterProvider{MeterProvider: sdkmetric.NewMeterProvider(), Histograms: NewProducer()}},
	} {
		b.Run(c.name, func(b *testing.B) {
			h, err := NewFloat64(c.mp, "s", "h", "s", "", bounds)
			if err != nil {
				b.Fatal(err)
			}
			s := h.Series(attrs)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				s.Record(float64(i%100) * 0.01)
			}
		})
	}
}
