package fencing

import (
	"context"
	"time"
)

// HoldRecorder is an optional capability of a Store: it keeps the write
// gate's barrier holds across a restart of the gate. A write the gate
// forwarded but whose outcome it did not see (cut off at shutdown, upstream
// timeout, a crash) may still be applied by the upstream for a grace
// period; without a record, the next process would forward higher tokens
// for its resource at once.
//
// The record belongs to one gate: it suits stores that serve one gate (the
// file and memory stores). Stores shared by several gates need per-gate
// entries with deadlines instead (the shared barrier).
//
// The Store interface does not include it: a server finds it with
// CapabilitiesOf, through any decorator.
type HoldRecorder interface {
	// StartHolds reports what the previous run of the gate left, then
	// records this run as started. The previous run either stopped
	// cleanly, leaving Holds (possibly none), or it never did (killed,
	// crashed): then Unclean is true and its writes in flight are
	// unknown. A store that never recorded a run reports neither.
	StartHolds(ctx context.Context) (PreviousHolds, error)
	// EndHolds records a clean stop, with the holds still running then:
	// per resource, until when a forwarded write may still be applied.
	EndHolds(ctx context.Context, holds map[string]time.Time) error
}

// PreviousHolds is what the previous run of a gate left.
type PreviousHolds struct {
	// Unclean: the previous run started and did not stop cleanly.
	Unclean bool
	// Holds are the holds recorded at a clean stop, as wall-clock
	// instants judged by the host's clock; some may have ended already.
	Holds map[string]time.Time
}
