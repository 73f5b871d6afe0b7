package storemetrics

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fencegate/fencegate/internal/atomichist"
)

// Group commit metrics, registered by Wrap when the store commits its
// writes in groups (CommitObserver: the file store): one measurement per
// commit, not per write.
const (
	// MetricCommitWrites is the histogram of the writes each group commit
	// carried (Prometheus: fencegate_store_commit_writes): its count is the
	// number of commits (flushes of the disk), its sum the writes they made
	// durable, so sum ÷ count is the mean group size.
	MetricCommitWrites = "fencegate.store.commit.writes"
	// MetricCommitDuration is the histogram of how long each group commit's
	// transaction took, its flushes included (Prometheus:
	// fencegate_store_commit_duration_seconds).
	MetricCommitDuration = "fencegate.store.commit.duration"
)

// CommitObserver is a store that commits writes in groups and reports
// each commit to f: the writes it carried and how long it took.
type CommitObserver interface {
	ObserveCommits(f func(writes int, took time.Duration))
}

// commitWriteBounds are powers of two up to the file store's largest group
// (512 writes).
var commitWriteBounds = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}

// observeCommits feeds the commit histograms from c. A failure to create
// them leaves them out; the store works the same.
func observeCommits(mp metric.MeterProvider, c CommitObserver) {
	writes, err1 := atomichist.NewFloat64(mp, ScopeName, MetricCommitWrites, "{write}",
		"Writes carried by each group commit of the store (one flush of the disk for all of them).", commitWriteBounds)
	took, err2 := atomichist.NewFloat64(mp, ScopeName, MetricCommitDuration, "s",
		"Duration of each group commit of the store, its flushes included.", durationBuckets)
	if err1 != nil || err2 != nil {
		return
	}
	w, d := writes.Series(attribute.NewSet()), took.Series(attribute.NewSet())
	c.ObserveCommits(func(n int, t time.Duration) {
		w.Record(float64(n))
		d.Record(t.Seconds())
	})
}
