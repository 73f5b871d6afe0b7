package proxy

import (
	"context"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/barrier"
)

// flight is one admitted write's place in the barrier that orders it: a
// *barrier.Ticket (this gate's barrier), a *sharedFlight (the store's), or
// flights (one of those per target of a write with two targets). Wait is
// called once, after the admission; then exactly one of Leave (the
// upstream answered, or the write was not forwarded) or Hold (the outcome
// is unknown) counts.
type flight interface {
	Wait(ctx context.Context, timeout time.Duration) error
	Leave()
	Hold(d time.Duration)
}

// orderer admits a write on its targets and gives it its places in a
// barrier, in an order that leaves no window (DESIGN §1.3): the local
// barrier registers before the admission check; the shared barrier
// registers in the same atomic step. When admit fails nothing stays
// registered, and the resource it names is the one that refused.
type orderer interface {
	admit(ctx context.Context, targets []Target, token fencing.Token) (flight, string, fencing.Admission, error)
	// heldUntil is when a refused writer may retry (zero: unknown).
	heldUntil(targets []Target) time.Time
}

// flights is a write's places on each of its targets, in the targets'
// fixed order, ending like one place (Leave or Hold, each on every
// target).
//
// A write fenced on two resources waits on each for the lower tokens in
// flight there. As every write carries one token for all its targets, no
// two writes can wait on each other: a wait cycle would need a token lower
// than another on one resource and higher on the other.
type flights []flight

// Wait waits on every target in turn, within one timeout overall.
func (fs flights) Wait(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, f := range fs {
		left := time.Until(deadline)
		if left <= 0 {
			return barrier.ErrTimeout
		}
		if err := f.Wait(ctx, left); err != nil {
			return err
		}
	}
	return nil
}

// Leave ends the write's place on every target.
func (fs flights) Leave() {
	for _, f := range fs {
		f.Leave()
	}
}

// Hold keeps the write's place on every target for d more.
func (fs flights) Hold(d time.Duration) {
	for _, f := range fs {
		f.Hold(d)
	}
}

// localOrder is the default orderer: this gate's own barrier.
type localOrder struct {
	b     *barrier.Barrier
	store fencing.Store
}

// admit registers the write on every target, then admits its token on
// each in order, stopping at the first refusal or fault. An admission
// before a refusal stands: it raised that resource's mark to token, which
// is at most the resource's issued token, so it only refuses tokens that
// an issued one already superseded, exactly what a write of its own with
// token would have done. The Admission is the first target's, for the
// audit log.
func (o localOrder) admit(ctx context.Context, targets []Target, token fencing.Token) (flight, string, fencing.Admission, error) {
	var f flight
	if len(targets) == 1 { // the common case, without a slice
		f = o.b.Register(targets[0].Resource, token)
	} else {
		fs := make(flights, len(targets))
		for i, t := range targets {
			fs[i] = o.b.Register(t.Resource, token)
		}
		f = fs
	}
	var first fencing.Admission
	for i, t := range targets {
		adm, err := o.store.Admit(ctx, fencing.AdmitRequest{Resource: t.Resource, Token: token, RequireLive: t.Strict})
		if err != nil {
			f.Leave()
			return nil, t.Resource, first, err
		}
		if i == 0 {
			first = adm
		}
	}
	return f, targets[0].Resource, first, nil
}

// heldUntil is the latest hold on any of the targets.
func (o localOrder) heldUntil(targets []Target) time.Time {
	var until time.Time
	for _, t := range targets {
		if h := o.b.HeldUntil(t.Resource); h.After(until) {
			until = h
		}
	}
	return until
}
