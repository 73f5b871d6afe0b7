package fencing

import (
	"context"
	"time"
)

// SharedBarrier is an optional capability of a Store shared by several
// gates (Valkey, Valkey Cluster, PostgreSQL): the in-flight barrier of DESIGN §1.3
// kept in the store, so that no gate forwards a write for a resource while
// a write for it with a lower token is in flight through any gate.
//
// Each admitted write registers an entry in the same atomic step that
// admits it, so there is no window between the check and the registration.
// An entry carries the registering gate's id and a deadline judged by the
// store's clock; a gate that crashes leaves entries that expire at their
// deadline rather than block the resource for ever. A refused admission
// registers nothing.
//
// Which entries a write waits for: those with a lower token that exist
// when its admission returns. A lower-token write admitted later is
// impossible (the admission raised the high-water mark to this token, and
// the store's admissions are linearizable per resource), so a flood of
// doomed lower tokens can never keep a valid write waiting. Entries with
// equal tokens never wait for each other.
//
// The Store interface does not include it: a server finds it with
// CapabilitiesOf, through any decorator.
//
// Implemented by valkeystore (single node and cluster) and pgstore (entries
// in a table written in the admission's transaction, under the resource's
// row lock that orders it against raises; deleted with pg_notify in the
// same statement; waits LISTEN on one dedicated connection per gate).
type SharedBarrier interface {
	// AdmitRegister admits req exactly as Store.Admit does and, only when
	// it is admitted, registers an entry for the write on behalf of gate,
	// expiring hold after the store's current time. Lower reports
	// whether an unexpired entry with a lower token existed then: only
	// then need the caller call WaitLower before forwarding. Refusals and
	// faults are those of Store.Admit; after a fault (ErrAmbiguous) an
	// entry may have been registered, and it stays until its deadline.
	AdmitRegister(ctx context.Context, req AdmitRequest, gate string, hold time.Duration) (adm Admission, e BarrierEntry, lower bool, err error)
	// WaitLower blocks until no unexpired entry with a lower token than
	// e's is registered for e's resource, and returns nil; or until ctx
	// ends (ctx.Err()); or the store fails (an error matching a store
	// fault: the caller must not forward). It wakes promptly when such an
	// entry leaves, and re-checks at the earliest deadline of the entries
	// it waits for and at a bounded interval, never in a busy loop.
	// Expired reports how many expired entries this call removed.
	WaitLower(ctx context.Context, e BarrierEntry) (expired int, err error)
	// Leave removes e and wakes the writes waiting on it. A failed Leave
	// leaves the entry until its deadline or a Leave that succeeds (the
	// gate retries one that failed with a store fault while the entry
	// lives): that delays writes, it never reorders them. Leaving an entry
	// twice, or one that has expired, is harmless.
	Leave(ctx context.Context, e BarrierEntry) error
}

// BarrierEntry names one registered write in a SharedBarrier.
type BarrierEntry struct {
	Resource string
	Token    Token
	// ID identifies the entry within its resource; it names the
	// registering gate's id ("<gate>:" appears in it).
	ID string
	// Expired is how many expired entries the registration removed.
	Expired int
}

// BarrierCheck is one check of a waiting write by a SharedBarrier.
type BarrierCheck struct {
	Lower   int           // lower entries still registered
	Wait    time.Duration // until the earliest of them expires; 0 or less: unknown
	Expired int           // expired entries the check removed
}

// WaitLowerLoop is SharedBarrier.WaitLower for a store that signals a
// resource's leaves: it checks, and while lower entries remain sleeps
// until wake's channel is closed, the check's Wait passes (at most
// recheck, which bounds the cost of a lost signal), done is closed (the
// store's signalling failed: failed's error is returned, so the wait
// fails closed) or ctx ends. wake is called before each check, so a leave
// between the check and the sleep is not missed. It returns the expired
// entries the checks removed, summed, with the first error.
func WaitLowerLoop(ctx context.Context, recheck time.Duration, wake func() <-chan struct{},
	done <-chan struct{}, failed func() error, check func(context.Context) (BarrierCheck, error)) (int, error) {
	expired := 0
	for {
		woken := wake()
		c, err := check(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return expired, ctx.Err()
			}
			return expired, err
		}
		expired += c.Expired
		if c.Lower == 0 {
			return expired, nil
		}
		wait := c.Wait
		if wait <= 0 || wait > recheck {
			wait = recheck
		}
		timer := time.NewTimer(wait)
		select {
		case <-woken:
		case <-timer.C:
		case <-done:
			timer.Stop()
			return expired, failed()
		case <-ctx.Done():
			timer.Stop()
			return expired, ctx.Err()
		}
		timer.Stop()
	}
}
