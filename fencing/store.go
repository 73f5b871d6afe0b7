package fencing

import (
	"context"
	"time"
)

// Store holds lease state and high-water marks. Every method is one atomic
// step in the store: it either takes full effect or none, and concurrent
// calls are linearizable per resource.
//
// Errors: refusals match the sentinels of this package (ErrInvalid,
// ErrTooLarge, ErrLeaseHeld, ErrLeaseLost, ErrStaleToken, ErrTokenNotIssued,
// ErrLeaseNotHeld, ErrNoCheckpoint) and mean nothing changed. Faults match
// ErrUnavailable (not performed), ErrAmbiguous (may have been performed) or
// ErrStoreLost; see IsStoreFault. Stores validate every request themselves.
type Store interface {
	// Acquire takes a lease. No live lease: a new lease with a token
	// above issued (issued+1, or more where a store's tokens skip ahead,
	// as the Valkey store's do). Live lease of the same owner: extended by
	// req.TTL, same token. Live lease of another owner: *LeaseHeldError.
	Acquire(ctx context.Context, req AcquireRequest) (Lease, error)
	// Renew extends the live lease if req.Owner and req.Token both match
	// it; otherwise ErrLeaseLost. An expired lease is not revived.
	Renew(ctx context.Context, req RenewRequest) (Lease, error)
	// Release ends the live lease held by req.Owner with req.Token and
	// reports true. If that lease already ended and no newer token was
	// issued, it reports false and changes nothing. Otherwise ErrLeaseLost.
	// Issued and high-water tokens are kept.
	Release(ctx context.Context, req ReleaseRequest) (bool, error)
	// Checkpoint saves state for the live holder and renews its lease by
	// its TTL, atomically. Not the live holder: ErrLeaseLost.
	Checkpoint(ctx context.Context, req CheckpointRequest) (Lease, error)
	// ReadCheckpoint returns the last checkpoint, or ErrNoCheckpoint.
	ReadCheckpoint(ctx context.Context, resource string) (Checkpoint, error)
	// Status describes the resource; an unknown one has zero tokens.
	Status(ctx context.Context, resource string) (Status, error)
	// List returns live leases in resource order.
	List(ctx context.Context, req ListRequest) ([]Lease, error)
	// Admit checks a write's token: high_water <= token <= issued (and a
	// live lease with the token when req.RequireLive), raising high_water
	// to the token in the same atomic step. Refusals are
	// *StaleTokenError (BeforeLoss when the token predates a floor the
	// store set after losing data), *TokenNotIssuedError or
	// ErrLeaseNotHeld. A store that finds it lost data for the resource
	// answers ErrStoreLost (see its doc).
	Admit(ctx context.Context, req AdmitRequest) (Admission, error)
	// Ping reports whether the store can answer now.
	Ping(ctx context.Context) error
	// Close releases the store's resources. The store is unusable after.
	Close() error
}

// QuickAdmitter is a Store that can answer some admissions at once,
// without waiting on I/O or on a lock held across I/O (the memory store;
// the file store at the high-water mark). A server that must not block,
// such as the gate's event loops, asks it first.
type QuickAdmitter interface {
	// AdmitNow admits req exactly as Admit would, in the same atomic
	// step, and reports true; or it changes nothing and reports false
	// when admitting would wait, or would refuse or fail: Admit then
	// answers.
	AdmitNow(req AdmitRequest) (Admission, bool)
}

// BatchAdmitter is a Store that admits several writes in one round trip
// (the Valkey store: one pipeline of admission scripts). A server that
// collects writes, such as the gate's event loops, hands them over
// together instead of one call per write.
type BatchAdmitter interface {
	// AdmitBatch admits each of reqs exactly as Admit would and sets out[i]
	// and errs[i] (both as long as reqs) to reqs[i]'s answer. Each
	// admission is atomic on its own; the batch is not: the requests may
	// run in any order, and one's refusal or fault changes nothing for the
	// others.
	AdmitBatch(ctx context.Context, reqs []AdmitRequest, out []Admission, errs []error)
}

// MarkReaders is a Store that can answer admissions at the high-water
// mark from a plain read sent on a connection the caller drives itself (the
// Valkey store on a single node). A server with its own poller, such as
// the gate's event loops, then waits for the answers among its other
// sockets, and the write never crosses to another goroutine. A read writes
// nothing, so a request it does not settle is admitted the usual way.
type MarkReaders interface {
	// OpenMarkReader dials a connection of its own for one caller. It
	// returns nil and no error when the store's setup reads marks only
	// through Admit (see the store's doc); an error when the connection
	// cannot be made now (the caller may try again later).
	OpenMarkReader(ctx context.Context) (MarkReader, error)
}

// MarkReader is one connection of a MarkReaders store. Its methods do not
// block and are called from one goroutine; one batch of reads is out at
// a time.
type MarkReader interface {
	// Fd is the connection's non-blocking socket, for the caller's poller.
	Fd() int
	// Send starts reading the marks of reqs (at least one). It reports
	// whether bytes are left to write: the caller waits until the socket
	// is writable and calls Flush. reqs must not change until Receive
	// reports done.
	Send(now time.Time, reqs []AdmitRequest) (pending bool, err error)
	// Flush writes what Send left; it reports whether bytes are left.
	Flush() (pending bool, err error)
	// Awaiting reports, without I/O, whether answers to the last Send are
	// still to be read: they come with the socket's readability, so the
	// caller waits for it (a Receive before would find nothing). It is
	// false after a Send none of whose requests needed a read: Receive
	// then settles the batch at once.
	Awaiting() bool
	// Receive reads what has arrived and reports whether every answer to
	// the last Send is in. Then settled[i] (as long as reqs) tells
	// whether reqs[i] is admitted at the mark, with out[i] exactly what
	// Admit would have answered at that instant; a request not settled
	// must be admitted the usual way (Admit, AdmitBatch). An error means
	// the connection is no good and none of the batch is settled: close
	// it.
	Receive(out []Admission, settled []bool) (done bool, err error)
	// Overdue reports whether the answers to the last Send have not come
	// within the store's command timeout of it: the caller then closes
	// the reader and admits the batch the usual way.
	Overdue(now time.Time) bool
	// Close closes the connection.
	Close() error
}

// Clock tells the time. Stores that own time (memory, file) take one so
// tests can move it; Valkey uses the server's TIME instead.
type Clock interface {
	Now() time.Time
}

// SystemClock is the host's clock. Its Now carries a monotonic reading, so
// comparisons within one process are immune to wall-clock steps.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Retainer is a Store that removes idle records itself (DESIGN §12,
// FENCEGATE_RETENTION): a resource with no live lease, untouched for the
// retention, goes with its checkpoint and then reads like one never used.
// Every token issued before the removal stays refused (stale-token),
// because the store's tokens follow its clock.
type Retainer interface {
	// RetentionStats reports what the store's retention has done since
	// it opened.
	RetentionStats() RetentionStats
}

// InFlightKeeper is a Retainer whose retention sweep can be shown the
// writes in flight through the gate in front of it (the memory and file
// stores, which serve one gate and whose barrier is the gate's own, the
// local barrier): DESIGN §12 keeps a record with a barrier entry, and only
// the gate knows its local barrier's entries.
type InFlightKeeper interface {
	// KeepInFlight makes the retention sweep keep every record for which
	// inFlight(resource) reports true when the sweep would remove it,
	// whatever the record's age: the sweep asks after the point where an
	// admission that starts later reads the removal, so a write registered
	// in inFlight before its admission either keeps its record or is
	// refused as one that came after the removal. inFlight must be safe
	// for concurrent use, quick, and must not call the store. It replaces
	// any earlier one; nil removes it.
	KeepInFlight(inFlight func(resource string) bool)
}

// RetentionStats are a Retainer's counters since the store opened.
type RetentionStats struct {
	// Removed counts records removed by retention.
	Removed uint64
	// Sweeps counts completed sweep passes (zero on a store whose records
	// expire by themselves, such as Valkey keys).
	Sweeps uint64
	// SweepTime is the time spent in sweep passes, in all.
	SweepTime time.Duration
	// ClockBehind counts readings of the store's clock found behind one
	// it had already used to issue tokens (a clock stepped back). The
	// store then issues tokens from the latest reading it used, and says
	// in its doc what else it does.
	ClockBehind uint64
}
