package proxy

import (
	"context"
	"time"
)

// RestoredHolds says what RestoreHolds found.
type RestoredHolds struct {
	// Recorded: Options.Holds is set; otherwise nothing was restored and
	// holds will not survive this run either.
	Recorded bool
	// Unclean: the previous run did not stop cleanly, so every resource is
	// held for the grace period.
	Unclean bool
	// Resources is how many resources are held because the previous run
	// left them held at its clean stop.
	Resources int
}

// RestoreHolds closes the barrier, for the rest of their grace, on the
// resources the previous run of the gate left held (writes it forwarded
// whose outcome it did not see may still be applied), or on every resource
// for the grace period if the previous run did not stop cleanly: its writes
// in flight are unknown. It then records this run as started. Call it once,
// before serving. Without Options.Holds, or with no grace, it does nothing.
func (g *Gate) RestoreHolds(ctx context.Context) (RestoredHolds, error) {
	if g.holds == nil {
		return RestoredHolds{}, nil
	}
	prev, err := g.holds.StartHolds(ctx)
	if err != nil {
		return RestoredHolds{Recorded: true}, err
	}
	out := RestoredHolds{Recorded: true, Unclean: prev.Unclean}
	if g.grace <= 0 {
		return out, nil
	}
	if prev.Unclean {
		g.barrier.HoldAll(g.grace)
	}
	now := time.Now()
	for res, until := range prev.Holds {
		if d := until.Sub(now); d > 0 {
			g.barrier.HoldResource(res, min(d, g.grace))
			out.Resources++
		}
	}
	return out, nil
}

// Close stops the gate forwarding fenced writes (a write still waiting at
// the barrier is refused 503 gate-stopping) and records, in Options.Holds,
// until when the writes it already forwarded may still be applied: the end
// of their hold, or the grace period for those still in flight. While the
// hold on every resource after an unclean previous stop still runs, it
// records nothing, so the next start sees an unclean stop again. Call it
// once the gate's listener has stopped (http.Server.Shutdown returned). It
// reports how many resources it recorded as held.
//
// With Options.SharedBarrier, it first stops retrying the removals of
// entries that failed (they stay until their deadlines) and waits for the
// removals still in progress, each bounded by 5 s, until ctx ends: then it
// cancels them (their entries stay until their deadlines), still waits for
// them to return, and returns ctx's error without recording holds. Close
// never waits past ctx for the store, and leaves no goroutine behind.
func (g *Gate) Close(ctx context.Context) (int, error) {
	var stopErr error
	if o, ok := g.order.(*sharedOrder); ok {
		stopErr = o.close(ctx)
	}
	holds := g.barrier.Close(max(g.grace, 0))
	if g.holds == nil || stopErr != nil {
		return len(holds), stopErr
	}
	if !g.barrier.AllHeldUntil().IsZero() {
		// Every resource is still held after an unclean previous stop:
		// leave this run recorded as unclean, so the next start holds
		// every resource again rather than forget that hold.
		return len(holds), nil
	}
	return len(holds), g.holds.EndHolds(ctx, holds)
}
