package storemetrics

import (
	"context"

	"go.opentelemetry.io/otel/metric"

	"github.com/fencegate/fencegate/fencing"
)

// Retention metrics, registered by Wrap when the store is a
// fencing.Retainer (DESIGN §12): counters read from the store's own
// RetentionStats at each collection.
const (
	// MetricRetentionRemoved counts records removed by retention
	// (Prometheus: fencegate_store_retention_removed_total).
	MetricRetentionRemoved = "fencegate.store.retention.removed"
	// MetricRetentionSweeps counts completed sweep passes.
	MetricRetentionSweeps = "fencegate.store.retention.sweeps"
	// MetricRetentionSweepTime is the time spent sweeping, in seconds
	// (Prometheus: fencegate_store_retention_sweep_seconds_total).
	MetricRetentionSweepTime = "fencegate.store.retention.sweep"
	// MetricClockBehind counts readings of the store's clock behind one it
	// had used for tokens (a clock stepped back).
	MetricClockBehind = "fencegate.store.clock.behind"
)

// observeRetention registers the retention counters of r on mp's meter.
// A failure to register leaves them out; the store works the same.
func observeRetention(mp metric.MeterProvider, r fencing.Retainer) {
	m := mp.Meter(ScopeName)
	removed, err1 := m.Int64ObservableCounter(MetricRetentionRemoved, metric.WithUnit("{record}"),
		metric.WithDescription("Records the store removed because they were idle for FENCEGATE_RETENTION."))
	sweeps, err2 := m.Int64ObservableCounter(MetricRetentionSweeps, metric.WithUnit("{sweep}"),
		metric.WithDescription("Retention sweep passes the store completed."))
	took, err3 := m.Float64ObservableCounter(MetricRetentionSweepTime, metric.WithUnit("s"),
		metric.WithDescription("Time the store spent in retention sweep passes."))
	behind, err4 := m.Int64ObservableCounter(MetricClockBehind, metric.WithUnit("{reading}"),
		metric.WithDescription("Readings of the store's clock behind one it had already used to issue tokens."))
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return
	}
	_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := r.RetentionStats()
		o.ObserveInt64(removed, int64(st.Removed))
		o.ObserveInt64(sweeps, int64(st.Sweeps))
		o.ObserveFloat64(took, st.SweepTime.Seconds())
		o.ObserveInt64(behind, int64(st.ClockBehind))
		return nil
	}, removed, sweeps, took, behind)
}
