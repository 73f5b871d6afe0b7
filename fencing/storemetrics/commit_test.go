package storemetrics_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/storemetrics"
)

// groupStore is a store that reports group commits, as the file store does.
type groupStore struct {
	*memstore.Store
	observe func(writes int, took time.Duration)
}

func (g *groupStore) ObserveCommits(f func(writes int, took time.Duration)) { g.observe = f }

// TestCommitHistograms: a store that commits in groups gets its commits
// counted through the wrapper's meter: one sample per commit, the writes
// it carried and its duration.
func TestCommitHistograms(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	gs := &groupStore{Store: memstore.New(memstore.Options{})}
	defer gs.Close()
	storemetrics.Wrap(gs, mp, nil)
	if gs.observe == nil {
		t.Fatal("Wrap did not observe the store's commits")
	}
	gs.observe(3, 2*time.Millisecond)
	gs.observe(5, 4*time.Millisecond)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	type point struct {
		count uint64
		sum   float64
		unit  string
	}
	got := map[string]point{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
				for _, dp := range h.DataPoints {
					p := got[m.Name]
					p.count += dp.Count
					p.sum += dp.Sum
					p.unit = m.Unit
					got[m.Name] = p
				}
			}
		}
	}
	if w := got[storemetrics.MetricCommitWrites]; w.count != 2 || w.sum != 8 || w.unit != "{write}" {
		t.Fatalf("%s = %+v, want 2 commits carrying 8 writes, unit {write}", storemetrics.MetricCommitWrites, w)
	}
	if d := got[storemetrics.MetricCommitDuration]; d.count != 2 || d.sum < 0.0059 || d.sum > 0.0061 || d.unit != "s" {
		t.Fatalf("%s = %+v, want 2 commits taking 6 ms in all, unit s", storemetrics.MetricCommitDuration, d)
	}
}
