package proxy

import (
	"context"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/barrier"
)

// flight is a fenced write's places in the barrier: one ticket per target
// resource, registered in the targets' fixed order. It ends like a single
// ticket (Leave or Hold, each on every resource).
//
// A write fenced on two resources waits on each for the lower tokens in
// flight there. As every write carries one token for all its targets, no
// two writes can wait on each other: a wait cycle would need a token lower
// than another on one resource and higher on the other.
type flight struct {
	b       *barrier.Barrier
	tickets []*barrier.Ticket
	res     []string
}

// register registers a write with token on every target.
func (g *Gate) register(targets []Target, token fencing.Token) *flight {
	f := &flight{b: g.barrier, tickets: make([]*barrier.Ticket, len(targets)), res: make([]string, len(targets))}
	for i, t := range targets {
		f.res[i] = t.Resource
		f.tickets[i] = g.barrier.Register(t.Resource, token)
	}
	return f
}

// Wait waits on every resource in turn, within one timeout overall.
func (f *flight) Wait(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, t := range f.tickets {
		left := time.Until(deadline)
		if left <= 0 {
			return barrier.ErrTimeout
		}
		if err := t.Wait(ctx, left); err != nil {
			return err
		}
	}
	return nil
}

// Leave deregisters the write on every resource.
func (f *flight) Leave() {
	for _, t := range f.tickets {
		t.Leave()
	}
}

// Hold keeps the write registered on every resource for d more.
func (f *flight) Hold(d time.Duration) {
	for _, t := range f.tickets {
		t.Hold(d)
	}
}

// HeldUntil is the latest HeldUntil of the write's resources.
func (f *flight) HeldUntil() time.Time {
	var until time.Time
	for _, r := range f.res {
		until = later(until, f.b.HeldUntil(r))
	}
	return until
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// admit admits token on every target, in order, and stops at the first
// refusal or fault, returning the resource it concerns. An admission
// before a refusal stands: it raised that resource's mark to token, which
// is at most the resource's issued token, so it only refuses tokens that
// an issued one already superseded, exactly what a write of its own with
// token would have done. The Admission is the first target's, for the
// audit log.
func (g *Gate) admit(ctx context.Context, targets []Target, token fencing.Token) (string, fencing.Admission, error) {
	var first fencing.Admission
	for i, t := range targets {
		adm, err := g.store.Admit(ctx, fencing.AdmitRequest{Resource: t.Resource, Token: token, RequireLive: t.Strict})
		if err != nil {
			return t.Resource, first, err
		}
		if i == 0 {
			first = adm
		}
	}
	return targets[0].Resource, first, nil
}
