package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/barrier"
	"github.com/fencegate/fencegate/fencing/problem"
)

// The admission pipeline, one for every engine: a fenced write's targets
// are taken one at a time in resource order; on each, the write is
// registered at the barrier before (local) or with (shared) the store's
// admission check, then waits for its turn. The strategies (admitNow for a
// store that answers at once, the loops' batches and mark reads in
// loopadmit_linux.go and loopmarks_linux.go) are shortcuts through the
// same steps, and end in waitTurn when the write cannot pass at once.

// admitWrite admits fenced write x (passFence) in the store and waits for
// its turn at the barrier, target by target in their fixed order (see
// flights). It returns the write's place, to forward under, or false when
// x was refused (its answer set, every place taken left). It may wait: for
// the store, and behind lower tokens in flight, up to BarrierTimeout; a
// write with two targets waits on the second only for what is left of one
// BarrierTimeout counted from its start: its first place (with the shared
// barrier, an entry that lives BarrierTimeout and the write's own
// timeouts) must outlast the wait on the second.
//
// This is the one admission pipeline: every engine's strategy (admitNow,
// the loops' batches and mark reads) registers before it admits, as
// order.admit does, and ends in waitTurn when the write cannot pass at
// once.
func (g *Gate) admitWrite(x *exchange, d Decision) (flight, bool) {
	var taken flights
	var deadline time.Time // of the second target's wait: the budget counts from the start
	if len(d.Targets) > 1 {
		deadline = time.Now().Add(g.barrierTimeout)
	}
	for i, target := range d.Targets {
		t, adm, err := g.order.admit(x.ctx, target)
		if i == 0 {
			x.audit.admitted(adm)
		}
		if err != nil {
			taken.Leave()
			g.refuseWrite(x, err, target.Resource, target.Token)
			return nil, false
		}
		timeout := g.barrierTimeout
		if i > 0 {
			timeout = time.Until(deadline)
		}
		if !g.waitTurn(x, target, t, timeout) {
			taken.Leave()
			return nil, false
		}
		if len(d.Targets) == 1 {
			return t, true // the common case, without a slice
		}
		taken = append(taken, t)
	}
	return taken, true
}

// admitNow is admitWrite without waiting, for the event loops: with this
// gate's own barrier, one target and a store that can answer at once
// (fencing.QuickAdmitter), it registers and admits the write. It returns
// the write's place and whether it may be forwarded now; nil when it could
// not admit at once (nothing is left registered: admitWrite must run).
// When the write must wait its turn, waitTurn does that.
func (g *Gate) admitNow(x *exchange, d Decision) (*barrier.Ticket, bool) {
	lo, ok := g.order.(localOrder)
	if !ok || g.quick == nil || len(d.Targets) != 1 {
		return nil, false
	}
	target := d.Targets[0]
	t := lo.b.Register(target.Resource, target.Token)
	adm, ok := g.quick.AdmitNow(fencing.AdmitRequest{Resource: target.Resource, Token: target.Token, RequireLive: target.Strict})
	if !ok {
		t.Leave()
		return nil, false
	}
	x.audit.admitted(adm)
	return t, g.passNow(t)
}

// passNow reports whether admitted write t may be forwarded at once, with
// no lower token in flight on its resource (see Ticket.Pass); false leaves
// the wait, and a barrier closed meanwhile, to waitTurn.
func (g *Gate) passNow(t *barrier.Ticket) bool {
	if g.barrierOff {
		return true
	}
	now, err := t.Pass()
	return now && err == nil
}

// waitTurn waits, up to timeout, until write x, admitted on target, may be
// forwarded there: no lower token in flight on target's resource. It
// reports false when x was refused (its place t left, its answer set).
func (g *Gate) waitTurn(x *exchange, target Target, t flight, timeout time.Duration) bool {
	err := g.wait(x.ctx, t, timeout)
	if err == nil {
		return true
	}
	t.Leave()
	resource, token := target.Resource, target.Token
	switch {
	case errors.Is(err, barrier.ErrClosed):
		p := problem.New(http.StatusServiceUnavailable, "gate-stopping",
			"the gate is shutting down; this write was admitted but not forwarded: retry it with the same token")
		p.Headers = http.Header{"Retry-After": {"1"}}
		g.refuseWrite(x, p, resource, token)
	case fencing.IsStoreFault(err): // the shared barrier's store failed
		g.refuseWrite(x, err, resource, token)
	default:
		p := problem.New(http.StatusServiceUnavailable, "barrier-timeout",
			"a write with a lower token for this resource is still in flight through this gate (or, with the shared barrier, any gate), or the barrier is held closed after a write whose outcome is unknown (upstream timeout, body cut off, restart); this write was admitted but not forwarded: retry it with the same token")
		p.Headers = http.Header{"Retry-After": {strconv.Itoa(retryAfter(g.order.heldUntil(target)))}}
		g.refuseWrite(x, p, resource, token)
	}
	return false
}

func (g *Gate) wait(ctx context.Context, t flight, timeout time.Duration) error {
	if g.barrierOff {
		return nil
	}
	return t.Wait(ctx, max(timeout, 0))
}
