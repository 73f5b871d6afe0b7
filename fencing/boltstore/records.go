package boltstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

// opError keeps a domain refusal apart from bbolt's own errors.
type opError struct{ err error }

func (e *opError) Error() string { return e.err.Error() }

// classify turns bbolt's errors into the domain's faults. committing says
// whether the operation had run and bbolt failed while committing it: the
// write may have reached the disk, so the outcome is ambiguous.
func (s *Store) classify(err error, committing bool) error {
	var op *opError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &op):
		return op.err
	case errors.Is(err, berrors.ErrDatabaseNotOpen), errors.Is(err, berrors.ErrTxClosed):
		return fmt.Errorf("%w: store file %s is closed", fencing.ErrUnavailable, s.path)
	case committing:
		return fmt.Errorf("%w: committing to store file %s: %w", fencing.ErrAmbiguous, s.path, err)
	default:
		return fmt.Errorf("%w: store file %s: %w", fencing.ErrUnavailable, s.path, err)
	}
}

// load reads the resource's record in tx, lifted to the store's floor at
// now; a missing one is empty (and not lifted, so that an unknown resource
// reads as zeros).
func (s *Store) load(tx *bolt.Tx, resource string, now time.Time) (*record.Record, error) {
	b := tx.Bucket(bucketRecords)
	if b == nil {
		return nil, errors.New("records bucket missing")
	}
	v := b.Get([]byte(resource))
	if v == nil {
		return &record.Record{}, nil
	}
	r, err := decode(resource, v)
	if err != nil {
		return nil, err
	}
	r.Lift(s.floor, now)
	return r, nil
}

// decode parses a stored record.
func decode(resource string, v []byte) (*record.Record, error) {
	r := &record.Record{}
	if err := json.Unmarshal(v, r); err != nil {
		return nil, fmt.Errorf("corrupt record for %q: %w", resource, err)
	}
	return r, nil
}

// save writes r as the resource's record in tx.
func save(tx *bolt.Tx, resource string, r *record.Record) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketRecords).Put([]byte(resource), v)
}

// update runs op on the resource's record as one call of a group commit
// (group.go): op reports whether it changed the record; the record is then
// saved (and op may store more through tx in the same transaction) and
// committed, with every other call of its group, in one transaction and one
// flush, before update returns. A refusal or no change writes nothing. op
// reports a bbolt failure of its own as a *storageError, anything else it
// returns is a refusal. op may run more than once (when a neighbour in its
// group fails, on a fresh transaction each time): it must only act on tx
// and r. stateBytes is the checkpoint state op writes, if any.
func update[T any](s *Store, ctx context.Context, resource string, stateBytes int, op func(tx *bolt.Tx, r *record.Record, now time.Time) (T, bool, error)) (T, error) {
	var zero, result T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c := &call{resource: resource, bytes: stateBytes, run: func(tx *bolt.Tx, r *record.Record, now time.Time) (bool, error) {
		v, changed, err := op(tx, r, now)
		if err != nil {
			return false, err
		}
		result = v
		return changed, nil
	}}
	if err := s.do(ctx, c); err != nil {
		return zero, err
	}
	return result, nil
}

// view runs fn in a read-only transaction.
func (s *Store) view(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.failure(); err != nil {
		return err
	}
	return s.classify(s.db.View(fn), false)
}

// updateAlone runs fn in a write transaction of its own, outside the
// group commit (the gate's hold record, at start and stop), and classifies
// its error as a commit's. A failing commit stops the store (fail).
func (s *Store) updateAlone(fn func(tx *bolt.Tx) error) error {
	if err := s.failure(); err != nil {
		return err
	}
	var fnErr error
	err := s.db.Update(func(tx *bolt.Tx) error {
		fnErr = fn(tx)
		return fnErr
	})
	if err != nil && fnErr == nil {
		s.fail(err)
	}
	return s.classify(err, true)
}

// fail stops the store after a commit that failed: every operation,
// reads and admissions at the mark included, answers ErrUnavailable from
// then on, until the process opens the file again.
//
// A failed commit cannot be taken back. When a flush fails, the pages it
// was flushing may be on the disk or not, and the kernel may already have
// marked them clean in its page cache; bbolt, rolling back, reads its
// newest meta page from the file as the cache shows it, so the store would
// go on reading, and admitting at, marks that were never made durable
// (after a power loss, an older token would pass after a newer one). So
// the store fails closed, as databases do after a failed flush (etcd and
// PostgreSQL stop), and logs why: restart fencegate once the disk is
// sound; the file is checked again at open (its lineage marker, see
// lineage.go).
func (s *Store) fail(err error) {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) || errors.Is(err, berrors.ErrTxClosed) || s.closed.Load() {
		return // closing, not failing
	}
	stop := fmt.Errorf("%w: store file %s: a commit failed (%v): the store stopped, as its file may hold writes that are not on the disk; restart fencegate once the disk is sound",
		fencing.ErrUnavailable, s.path, err)
	if s.failed.CompareAndSwap(nil, &stop) && s.log != nil {
		s.log.Error("boltstore: a commit to the store file failed: every lease operation and write is refused until fencegate restarts",
			"path", s.path, "error", err.Error())
	}
}

// failure is the error every operation answers after fail, nil before.
func (s *Store) failure() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// viewRecord runs fn in a read-only transaction on the resource's record
// as load gives it, at the clock's reading taken inside the transaction.
// fn acts on its own copy: nothing it changes is saved.
func (s *Store) viewRecord(ctx context.Context, resource string, fn func(tx *bolt.Tx, r *record.Record, now time.Time) error) error {
	return s.view(ctx, func(tx *bolt.Tx) error {
		now := s.clock.Now()
		r, err := s.load(tx, resource, now)
		if err != nil {
			return err
		}
		return fn(tx, r, now)
	})
}

// tokenClock is the clock reading a new lease's token is at least (see
// record.Record.AcquireAt).
func (s *Store) tokenClock() fencing.Token {
	var c fencing.Token
	if s.tokens != nil {
		c = s.tokens.Read(s.clock) // read now, not before: see retention.Clock.Read
	}
	if sw := fencing.Token(s.swept.Load()); sw > 0 {
		c = max(c, sw+1)
	}
	return c
}

// storageError marks a bbolt failure inside an operation, so update does
// not mistake it for a domain refusal.
type storageError struct{ err error }

func (e *storageError) Error() string { return e.err.Error() }
func (e *storageError) Unwrap() error { return e.err }
