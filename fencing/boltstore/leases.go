package boltstore

import (
	"bytes"
	"context"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

// Acquire implements fencing.Store.
func (s *Store) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	return update(s, ctx, req.Resource, 0, func(_ *bolt.Tx, r *record.Record, now time.Time) (fencing.Lease, bool, error) {
		l, err := r.AcquireAt(req, now, s.tokenClock())
		return l, err == nil, err
	})
}

// Renew implements fencing.Store.
func (s *Store) Renew(ctx context.Context, req fencing.RenewRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	return update(s, ctx, req.Resource, 0, func(_ *bolt.Tx, r *record.Record, now time.Time) (fencing.Lease, bool, error) {
		l, err := r.Renew(req, now)
		return l, err == nil, err
	})
}

// Release implements fencing.Store. Releasing a lease that already ended
// writes nothing.
func (s *Store) Release(ctx context.Context, req fencing.ReleaseRequest) (bool, error) {
	if err := req.Validate(); err != nil {
		return false, err
	}
	return update(s, ctx, req.Resource, 0, func(_ *bolt.Tx, r *record.Record, now time.Time) (bool, bool, error) {
		released, err := r.Release(req, now)
		return released, released, err
	})
}

// Checkpoint implements fencing.Store. The state and the renewed record
// commit together.
func (s *Store) Checkpoint(ctx context.Context, req fencing.CheckpointRequest) (fencing.Lease, error) {
	if err := req.Validate(s.maxState); err != nil {
		return fencing.Lease{}, err
	}
	return update(s, ctx, req.Resource, len(req.State), func(tx *bolt.Tx, r *record.Record, now time.Time) (fencing.Lease, bool, error) {
		l, err := r.Checkpoint(req, now)
		if err != nil {
			return l, false, err
		}
		if err := tx.Bucket(bucketStates).Put([]byte(req.Resource), req.State); err != nil {
			// Not a refusal: a storage failure, classified by update.
			return l, false, &storageError{err}
		}
		return l, true, nil
	})
}

// ReadCheckpoint implements fencing.Store.
func (s *Store) ReadCheckpoint(ctx context.Context, resource string) (fencing.Checkpoint, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Checkpoint{}, err
	}
	var cp fencing.Checkpoint
	err := s.viewRecord(ctx, resource, func(tx *bolt.Tx, r *record.Record, now time.Time) error {
		var err error
		// ReadCheckpoint copies the state out of the mmap.
		cp, err = r.ReadCheckpoint(tx.Bucket(bucketStates).Get([]byte(resource)), now)
		if err != nil {
			return &opError{err}
		}
		return nil
	})
	return cp, err
}

// Status implements fencing.Store.
func (s *Store) Status(ctx context.Context, resource string) (fencing.Status, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Status{}, err
	}
	var st fencing.Status
	err := s.viewRecord(ctx, resource, func(_ *bolt.Tx, r *record.Record, now time.Time) error {
		st = r.Status(resource, now)
		return nil
	})
	return st, err
}

// List implements fencing.Store. It walks the records in key (resource)
// order from the prefix, decoding each; ended leases are skipped, so a
// prefix with many ended leases costs more than the leases it returns.
func (s *Store) List(ctx context.Context, req fencing.ListRequest) ([]fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	leases := []fencing.Lease{}
	limit := req.EffectiveLimit()
	prefix := []byte(req.Prefix)
	start := prefix
	if req.After > req.Prefix {
		start = []byte(req.After) // skipped below: only names after it
	}
	err := s.view(ctx, func(tx *bolt.Tx) error {
		now := s.clock.Now()
		c := tx.Bucket(bucketRecords).Cursor()
		for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if string(k) <= req.After {
				continue
			}
			name := string(k)
			r, err := decode(name, v)
			if err != nil {
				return err
			}
			r.Lift(s.floor, now)
			if l, ok := r.Live(name, now); ok {
				leases = append(leases, l)
				if len(leases) == limit {
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return leases, nil
}
