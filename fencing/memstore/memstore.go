// Package memstore is an in-process fencing.Store for tests and demos. It
// forgets everything when the process exits, so tokens issued before a
// restart can be issued again: never use it where a fencing guarantee across
// restarts matters.
//
// Tokens: with Options.ClockTokens a new lease gets max(issued+1, the
// host clock in µs) and a fresh record starts with its high-water mark at
// that clock (DESIGN §12), so a token issued before a record was removed by
// retention stays refused. The token clock never runs backwards: a reading
// behind the latest used is counted (RetentionStats.ClockBehind) and the
// latest one is used instead. Without ClockTokens tokens count from one,
// which tests and demos read more easily; records removed by retention then
// move every later fresh record past the highest token they had issued.
package memstore

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
	"github.com/fencegate/fencegate/fencing/retention"
)

// Store is an in-memory fencing.Store. One mutex serializes every operation,
// which makes each one atomic. Safe for concurrent use.
type Store struct {
	clock     fencing.Clock
	maxState  int
	tokens    *retention.Clock // nil: tokens count from one
	retention time.Duration
	batch     int
	stats     retention.Stats
	sweeper   *retention.Loop

	mu      sync.Mutex
	records map[string]*record.Record
	states  map[string][]byte
	// removedTop is the highest token of a record retention removed: a
	// fresh record counting from one starts above it.
	removedTop fencing.Token
	closed     bool
	gate       gateHolds
	// inFlight reports the resources with writes in flight through the
	// gate (KeepInFlight): the sweep keeps their records. Nil: none.
	inFlight func(resource string) bool
}

var (
	_ fencing.Store    = (*Store)(nil)
	_ fencing.Retainer = (*Store)(nil)
)

// Options configure a Store.
type Options struct {
	// Clock judges expiry; nil means fencing.SystemClock.
	Clock fencing.Clock
	// MaxCheckpointBytes limits checkpoint state; 0 means
	// fencing.DefaultMaxCheckpointBytes.
	MaxCheckpointBytes int
	// ClockTokens issues tokens on the clock (see the package doc), as
	// FENCEGATE_STORE=memory: does; false counts from one.
	ClockTokens bool
	// Retention removes a record with no live lease and no write in
	// flight (KeepInFlight) untouched for this long (FENCEGATE_RETENTION); 0 keeps every record. A background sweep
	// runs every SweepInterval (0: retention.Interval(Retention)) until
	// Close; Sweep runs one pass now.
	Retention     time.Duration
	SweepInterval time.Duration
	// SweepBatch is how many records a sweep examines per hold of the
	// store's lock; 0 means retention.DefaultBatch.
	SweepBatch int
}

// New returns an empty store.
func New(opts Options) *Store {
	if opts.Clock == nil {
		opts.Clock = fencing.SystemClock{}
	}
	if opts.MaxCheckpointBytes == 0 {
		opts.MaxCheckpointBytes = fencing.DefaultMaxCheckpointBytes
	}
	if opts.SweepBatch <= 0 {
		opts.SweepBatch = retention.DefaultBatch
	}
	s := &Store{clock: opts.Clock, maxState: opts.MaxCheckpointBytes, retention: max(opts.Retention, 0), batch: opts.SweepBatch,
		records: map[string]*record.Record{}, states: map[string][]byte{}}
	if opts.ClockTokens {
		s.tokens = retention.NewClock(&s.stats)
	}
	if s.retention > 0 {
		every := opts.SweepInterval
		if every <= 0 {
			every = retention.Interval(s.retention)
		}
		s.sweeper = retention.Start(every, s.sweep, &s.stats, nil)
	}
	return s
}

// tokenClock is the clock reading a new lease's token is at least (see
// record.Record.AcquireAt); the caller holds the mutex.
func (s *Store) tokenClock() fencing.Token {
	var c fencing.Token
	if s.tokens != nil {
		c = s.tokens.Read(s.clock) // read now, not before: see retention.Clock.Read
	}
	if s.removedTop > 0 {
		c = max(c, s.removedTop+1)
	}
	return c
}

// lock takes the mutex; it fails if the store is closed.
func (s *Store) lock() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fencing.ErrUnavailable
	}
	return nil
}

// rec returns the resource's record, creating an empty one (not stored
// until the caller keeps it).
func (s *Store) rec(resource string) *record.Record {
	if r, ok := s.records[resource]; ok {
		return r
	}
	return &record.Record{}
}

// apply runs op on the resource's record in place. A record method that
// refuses leaves the record unchanged (record's contract), so a refusal
// changes nothing; a new record is kept only when op succeeds.
func apply[T any](s *Store, ctx context.Context, resource string, op func(r *record.Record) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if err := s.lock(); err != nil {
		return zero, err
	}
	defer s.mu.Unlock()
	r, ok := s.records[resource]
	if !ok {
		r = &record.Record{}
	}
	v, err := op(r)
	if err != nil {
		return zero, err
	}
	if !ok {
		s.records[resource] = r
	}
	return v, nil
}

// Acquire implements fencing.Store.
func (s *Store) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	return apply(s, ctx, req.Resource, func(r *record.Record) (fencing.Lease, error) {
		now := s.clock.Now()
		return r.AcquireAt(req, now, s.tokenClock())
	})
}

// Renew implements fencing.Store.
func (s *Store) Renew(ctx context.Context, req fencing.RenewRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	return apply(s, ctx, req.Resource, func(r *record.Record) (fencing.Lease, error) {
		return r.Renew(req, s.clock.Now())
	})
}

// Release implements fencing.Store.
func (s *Store) Release(ctx context.Context, req fencing.ReleaseRequest) (bool, error) {
	if err := req.Validate(); err != nil {
		return false, err
	}
	return apply(s, ctx, req.Resource, func(r *record.Record) (bool, error) {
		return r.Release(req, s.clock.Now())
	})
}

// Checkpoint implements fencing.Store.
func (s *Store) Checkpoint(ctx context.Context, req fencing.CheckpointRequest) (fencing.Lease, error) {
	if err := req.Validate(s.maxState); err != nil {
		return fencing.Lease{}, err
	}
	return apply(s, ctx, req.Resource, func(r *record.Record) (fencing.Lease, error) {
		l, err := r.Checkpoint(req, s.clock.Now())
		if err == nil {
			s.states[req.Resource] = append([]byte(nil), req.State...)
		}
		return l, err
	})
}

// ReadCheckpoint implements fencing.Store.
func (s *Store) ReadCheckpoint(ctx context.Context, resource string) (fencing.Checkpoint, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Checkpoint{}, err
	}
	if err := s.lock(); err != nil {
		return fencing.Checkpoint{}, err
	}
	defer s.mu.Unlock()
	return s.rec(resource).ReadCheckpoint(s.states[resource], s.clock.Now())
}

// Status implements fencing.Store.
func (s *Store) Status(ctx context.Context, resource string) (fencing.Status, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Status{}, err
	}
	if err := s.lock(); err != nil {
		return fencing.Status{}, err
	}
	defer s.mu.Unlock()
	return s.rec(resource).Status(resource, s.clock.Now()), nil
}

// List implements fencing.Store. It takes the live leases under the prefix
// and after the cursor as they are at one instant, under the store's lock,
// and sorts them after releasing it, so writers wait only for the copy. It
// walks every record and sorts on every call: fine for tests and demos,
// not for millions of resources.
func (s *Store) List(ctx context.Context, req fencing.ListRequest) ([]fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	now := s.clock.Now()
	leases := []fencing.Lease{}
	for name, r := range s.records {
		if req.Wants(name) {
			if l, ok := r.Live(name, now); ok {
				leases = append(leases, l)
			}
		}
	}
	s.mu.Unlock()
	slices.SortFunc(leases, func(a, b fencing.Lease) int { return strings.Compare(a.Resource, b.Resource) })
	return leases[:min(len(leases), req.EffectiveLimit())], nil
}

// Admit implements fencing.Store.
func (s *Store) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	if err := req.Validate(); err != nil {
		return fencing.Admission{}, err
	}
	return apply(s, ctx, req.Resource, func(r *record.Record) (fencing.Admission, error) {
		now := s.clock.Now()
		if !r.Exists() {
			return fencing.Admission{}, record.Absent(req, s.tokenClock())
		}
		a, err := r.Admit(req, now)
		if err == nil && s.retention > 0 {
			r.Touch(now)
		}
		return a, err
	})
}

// AdmitNow implements fencing.QuickAdmitter: the memory store never waits
// on I/O, so it answers every admission that Admit would grant.
func (s *Store) AdmitNow(req fencing.AdmitRequest) (fencing.Admission, bool) {
	a, err := s.Admit(context.Background(), req)
	return a, err == nil
}

// Ping implements fencing.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.lock(); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// Close implements fencing.Store. It stops the retention sweep.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.sweeper.Stop()
	return nil
}

// RetentionStats implements fencing.Retainer.
func (s *Store) RetentionStats() fencing.RetentionStats { return s.stats.Snapshot() }

// Sweep runs one retention pass now (the background sweep runs them too)
// and reports how many records it removed. It does nothing without a
// retention.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	return retention.Run(ctx, s.sweep, &s.stats)
}

// KeepInFlight implements fencing.InFlightKeeper: the sweep keeps every
// record inFlight reports, whatever its age. It asks under the store's
// lock, in the same hold as the removal, so a write registered before its
// admission either is seen and keeps its record, or is admitted after the
// removal (and refused).
func (s *Store) KeepInFlight(inFlight func(resource string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight = inFlight
}

// sweep removes the records idle at the store's clock, examining at most
// s.batch of them per hold of the mutex: between batches it lets go, so
// operations interleave with a sweep of any size. Ranging over the map
// across those releases is sound (the spec allows changes to a map during
// its iteration; every access is under the mutex): an entry added meanwhile
// may be skipped until the next pass, none is visited twice.
func (s *Store) sweep(ctx context.Context) (int, error) {
	if s.retention <= 0 {
		return 0, nil
	}
	if err := s.lock(); err != nil {
		return 0, err
	}
	removed, seen := 0, 0
	for name, r := range s.records {
		if now := s.clock.Now(); r.Idle(now, s.retention) && (s.inFlight == nil || !s.inFlight(name)) {
			s.removedTop = max(s.removedTop, r.Issued)
			delete(s.records, name)
			delete(s.states, name)
			removed++
		}
		if seen++; seen%s.batch == 0 {
			s.mu.Unlock()
			if err := ctx.Err(); err != nil {
				return removed, err
			}
			if err := s.lock(); err != nil {
				return removed, err
			}
		}
	}
	s.mu.Unlock()
	return removed, nil
}
