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

// orderer admits a write on one target and gives it its place in a
// barrier, in an order that leaves no window (DESIGN §1.3): the local
// barrier registers before the admission check; the shared barrier
// registers in the same atomic step. When admit fails nothing stays
// registered.
type orderer interface {
	admit(ctx context.Context, target Target) (flight, fencing.Admission, error)
	// heldUntil is when a refused writer may retry (zero: unknown).
	heldUntil(target Target) time.Time
}

// flights is a write's places on each of its targets, in the targets'
// fixed (resource) order, ending like one place (Leave or Hold, each on
// every target). Gate.admitWrite takes them one target at a time:
// admitted and its turn come on the first before it registers on the
// second, as locks taken in one global order, so no two writes can wait
// on each other even though their tokens on two resources are unrelated.
type flights []flight

// Wait returns at once: each place was waited for as it was taken.
func (fs flights) Wait(context.Context, time.Duration) error { return nil }

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

// admit registers the write on target, then admits its token there.
func (o localOrder) admit(ctx context.Context, target Target) (flight, fencing.Admission, error) {
	t := o.b.Register(target.Resource, target.Token)
	adm, err := o.store.Admit(ctx, fencing.AdmitRequest{Resource: target.Resource, Token: target.Token, RequireLive: target.Strict})
	if err != nil {
		t.Leave()
		return nil, adm, err
	}
	return t, adm, nil
}

// heldUntil is the hold on target's resource.
func (o localOrder) heldUntil(target Target) time.Time { return o.b.HeldUntil(target.Resource) }
