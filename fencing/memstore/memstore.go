// Package memstore is an in-process fencing.Store for tests and demos. It
// forgets everything when the process exits, so tokens issued before a
// restart can be issued again: never use it where a fencing guarantee across
// restarts matters.
package memstore

import (
	"context"
	"sort"
	"sync"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

// Store is an in-memory fencing.Store. One mutex serializes every operation,
// which makes each one atomic. Safe for concurrent use.
type Store struct {
	clock    fencing.Clock
	maxState int

	mu      sync.Mutex
	records map[string]*record.Record
	states  map[string][]byte
	closed  bool
	gate    gateHolds
}

var _ fencing.Store = (*Store)(nil)

// Options configure a Store.
type Options struct {
	// Clock judges expiry; nil means fencing.SystemClock.
	Clock fencing.Clock
	// MaxCheckpointBytes limits checkpoint state; 0 means
	// fencing.DefaultMaxCheckpointBytes.
	MaxCheckpointBytes int
}

// New returns an empty store.
func New(opts Options) *Store {
	if opts.Clock == nil {
		opts.Clock = fencing.SystemClock{}
	}
	if opts.MaxCheckpointBytes == 0 {
		opts.MaxCheckpointBytes = fencing.DefaultMaxCheckpointBytes
	}
	return &Store{clock: opts.Clock, maxState: opts.MaxCheckpointBytes, records: map[string]*record.Record{}, states: map[string][]byte{}}
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
		return r.Acquire(req, s.clock.Now())
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

// List implements fencing.Store. It sorts the matching names on every call:
// fine for tests and demos, not for millions of resources.
func (s *Store) List(ctx context.Context, req fencing.ListRequest) ([]fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	names := make([]string, 0, len(s.records))
	for name := range s.records {
		if req.Wants(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	leases := []fencing.Lease{}
	for _, name := range names {
		if l, ok := s.records[name].Live(name, now); ok {
			leases = append(leases, l)
			if len(leases) == req.EffectiveLimit() {
				break
			}
		}
	}
	return leases, nil
}

// Admit implements fencing.Store.
func (s *Store) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	if err := req.Validate(); err != nil {
		return fencing.Admission{}, err
	}
	return apply(s, ctx, req.Resource, func(r *record.Record) (fencing.Admission, error) {
		return r.Admit(req, s.clock.Now())
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

// Close implements fencing.Store.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
