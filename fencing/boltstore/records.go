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
	return s.classify(s.db.View(fn), false)
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
