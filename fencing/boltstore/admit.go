package boltstore

import (
	"context"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

// admit decides req on r, which is empty when the store holds no record
// of the resource (record.Absent then answers).
func (s *Store) admit(r *record.Record, req fencing.AdmitRequest, now time.Time) (fencing.Admission, error) {
	if !r.Exists() {
		return fencing.Admission{}, record.Absent(req, s.tokenClock())
	}
	return r.Admit(req, now)
}

// Admit implements fencing.Store. An admission at the current mark (the
// common case: a holder writing with its token) is decided in a read-only
// transaction and writes nothing. Only a raise opens a read-write
// transaction, which checks again (the mark may have moved since the read)
// and commits the new mark with an fsync before returning.
func (s *Store) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	if err := req.Validate(); err != nil {
		return fencing.Admission{}, err
	}
	if a, ok := s.admitAtMark(ctx, req); ok {
		return a, nil
	}
	if s.beingRemoved(req.Resource) {
		// A read transaction begun now could still see the record the
		// running sweep call removes after it asked inFlight, and admit
		// a write the sweep did not see: decided after the call instead.
		return s.admitWrite(ctx, req)
	}
	var (
		a     fencing.Admission
		touch bool
	)
	err := s.viewRecord(ctx, req.Resource, func(_ *bolt.Tx, r *record.Record, now time.Time) error {
		var err error
		a, err = s.admit(r, req, now) // on a private copy: not saved
		if err != nil {
			return &opError{err}
		}
		touch = r.TouchStale(now, s.retention)
		return nil
	})
	if err != nil || !(a.Raised || touch) {
		return a, err
	}
	return s.admitWrite(ctx, req)
}

// admitWrite decides req in a call of a group commit, and writes the
// record when the admission raises its mark or its touch is stale.
func (s *Store) admitWrite(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	return update(s, ctx, req.Resource, 0, func(tx *bolt.Tx, r *record.Record, now time.Time) (fencing.Admission, bool, error) {
		if tx.Bucket(bucketRecords).Get([]byte(req.Resource)) == nil {
			// Removed (by the sweep) since a read found it, or being
			// removed when Admit looked: answered as the read path
			// answers a resource with no record, not from the empty
			// record the call lifted to the floor.
			r = &record.Record{}
		}
		a, err := s.admit(r, req, now)
		if err != nil {
			return a, false, err
		}
		touch := r.TouchStale(now, s.retention)
		if touch {
			r.Touch(now)
		}
		return a, a.Raised || touch, nil
	})
}

// AdmitNow implements fencing.QuickAdmitter: an admission at the
// resource's cached high-water mark (see admitAtMark) reads nothing from
// the file; a raise, which writes and syncs it, is left to Admit.
func (s *Store) AdmitNow(req fencing.AdmitRequest) (fencing.Admission, bool) {
	if req.Validate() != nil {
		return fencing.Admission{}, false
	}
	return s.admitAtMark(context.Background(), req)
}

// admitAtMark answers an admission from the mark cache when the cached
// committed record admits it without raising the mark: then reading the
// file would give the same answer. Anything else (a raise, a refusal, a
// resource not cached, a done context, a closed store) is left to the
// transaction path, which reports it as before.
func (s *Store) admitAtMark(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, bool) {
	if ctx.Err() != nil || s.closed.Load() || s.failed.Load() != nil {
		return fencing.Admission{}, false
	}
	e, ok := s.marks.get(req.Resource)
	if !ok {
		return fencing.Admission{}, false
	}
	r := e.rec // a copy: Admit moves the mark on it
	now := s.clock.Now()
	if r.TouchStale(now, s.retention) {
		return fencing.Admission{}, false // the transaction path touches it
	}
	a, err := r.Admit(req, now)
	if err != nil || a.Raised {
		return fencing.Admission{}, false
	}
	return a, true
}
