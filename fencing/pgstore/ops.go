package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

// attempts bounds the tries of one operation: a retry happens only when
// the previous try certainly changed nothing (see write and read).
const attempts = 3

// decision applies one operation to a resource's record at the database's
// now. It reports whether the record changed (and must be written back);
// an error is a refusal and leaves the record as it was.
type decision[T any] func(r *record.Record, now time.Time) (v T, changed bool, err error)

func (s *Store) begin(ctx context.Context, op string) (context.Context, context.CancelFunc, error) {
	if s.closed.Load() {
		return ctx, func() {}, fmt.Errorf("%w: %s: the postgres store is closed", fencing.ErrUnavailable, op)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, cancel, nil
}

// write runs decide on the resource's row, locked, in one transaction, and
// commits the record (and state, when not nil) if it changed. It tries
// again, at most attempts times in all, only when the try certainly did not
// commit: the connection was lost before COMMIT was sent, or a concurrent
// transaction created the resource's row first.
func write[T any](ctx context.Context, s *Store, op, resource string, decide decision[T], state []byte) (T, error) {
	return transact(ctx, s, op, resource, s.sql.readLocked, decide, state, nil)
}

// then is a step that runs in the transaction of transact after decide
// accepted (refusals skip it), before COMMIT, on v and the transaction; its
// error rolls everything back.
type then[T any] func(ctx context.Context, tx pgx.Tx, v T) (T, error)

// transact is write with the row read by lockSQL (readLocked, or
// readShared: a lock that orders the transaction against writes of the
// row but not against other shared readers) and an optional step after
// the decision. With a step the transaction always commits (unless decide
// or the step refused or failed), even when the record did not change.
func transact[T any](ctx context.Context, s *Store, op, resource, lockSQL string, decide decision[T], state []byte, step then[T]) (T, error) {
	ctx, cancel, err := s.begin(ctx, op)
	defer cancel()
	if err != nil {
		var zero T
		return zero, err
	}
	for try := 1; ; try++ {
		v, err, again := tryWrite(ctx, s, op, resource, lockSQL, decide, state, step)
		if !again || try == attempts || ctx.Err() != nil {
			return v, err
		}
	}
}

func tryWrite[T any](ctx context.Context, s *Store, op, resource, lockSQL string, decide decision[T], state []byte, step then[T]) (v T, err error, again bool) {
	var zero T
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return zero, classify(op, err, false), connectionLost(err)
	}
	defer s.rollback(ctx, tx)
	w, err := scanRow(tx.QueryRow(ctx, lockSQL, resource))
	if err != nil {
		return zero, classify(op, err, false), connectionLost(err)
	}
	if w.standby {
		return zero, standbyErr(op), false
	}
	if w.syncOff {
		// Nothing written yet: rolled back, nothing done.
		return zero, syncOffErr(op), false
	}
	r := w.record()
	v, changed, err := decide(r, w.now())
	if err != nil || (!changed && step == nil) {
		return v, err, false // a refusal, or nothing to write: roll back
	}
	if changed {
		save := s.sql.update
		if !w.found {
			save = s.sql.insert
		}
		if _, err := tx.Exec(ctx, save, args(resource, r)...); err != nil {
			// A unique violation: another transaction created the row
			// after our read; this one is rolled back, so trying again is
			// safe.
			return zero, classify(op, err, false), connectionLost(err) || isUniqueViolation(err)
		}
	}
	if state != nil {
		if _, err := tx.Exec(ctx, s.sql.saveState, resource, state); err != nil {
			return zero, classify(op, err, false), connectionLost(err)
		}
	}
	if step != nil {
		if v, err = step(ctx, tx, v); err != nil {
			return zero, classify(op, err, false), connectionLost(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return zero, classify(op, err, true), false
	}
	return v, nil, false
}

// rollback ends tx unless it committed (then it is a no-op). It runs even
// when ctx has ended, bounded by the statement timeout: a stalled server
// must not hold the caller. On a broken connection pgx closes it and the
// pool replaces it.
func (s *Store) rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// read runs one read-only statement (sql: read or readCheckpoint) and scans
// the resource's row, with extra destinations after the record's columns.
// It retries, at most attempts times in all, after a lost connection or a
// serialization failure: a read changes nothing.
func (s *Store) read(ctx context.Context, op, sql, resource string, extra ...any) (*row, error) {
	var w *row
	err := s.repeatable(ctx, op, func(ctx context.Context) (err error) {
		w, err = scanRow(s.pool.QueryRow(ctx, sql, resource), extra...)
		return err
	})
	if err == nil && w.standby {
		return nil, standbyErr(op)
	}
	return w, err
}

func scanRow(q pgx.Row, extra ...any) (*row, error) {
	w := &row{}
	if err := q.Scan(append(w.dest(), extra...)...); err != nil {
		return nil, err
	}
	return w, nil
}

// Acquire implements fencing.Store: issued+1 is committed before the lease
// is returned.
func (s *Store) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	return write(ctx, s, "acquire", req.Resource, func(r *record.Record, now time.Time) (fencing.Lease, bool, error) {
		clock := record.ClockMicros(now)
		if r.Issued > clock+fencing.Token(time.Second/time.Microsecond) {
			s.stats.ClockBehind() // the database's clock is behind this record's tokens
		}
		l, err := r.AcquireAt(req, now, clock)
		return l, err == nil, err
	}, nil)
}

// Renew implements fencing.Store.
func (s *Store) Renew(ctx context.Context, req fencing.RenewRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	return write(ctx, s, "renew", req.Resource, func(r *record.Record, now time.Time) (fencing.Lease, bool, error) {
		l, err := r.Renew(req, now)
		return l, err == nil, err
	}, nil)
}

// Release implements fencing.Store. Releasing a lease that already ended
// writes nothing.
func (s *Store) Release(ctx context.Context, req fencing.ReleaseRequest) (bool, error) {
	if err := req.Validate(); err != nil {
		return false, err
	}
	return write(ctx, s, "release", req.Resource, func(r *record.Record, now time.Time) (bool, bool, error) {
		released, err := r.Release(req, now)
		return released, released, err
	}, nil)
}

// Checkpoint implements fencing.Store: the state and the renewal commit
// together.
func (s *Store) Checkpoint(ctx context.Context, req fencing.CheckpointRequest) (fencing.Lease, error) {
	if err := req.Validate(s.maxState); err != nil {
		return fencing.Lease{}, err
	}
	return write(ctx, s, "checkpoint", req.Resource, func(r *record.Record, now time.Time) (fencing.Lease, bool, error) {
		l, err := r.Checkpoint(req, now)
		return l, err == nil, err
	}, req.State)
}

// ReadCheckpoint implements fencing.Store. Record and state are read by one
// statement, so they are of one snapshot.
func (s *Store) ReadCheckpoint(ctx context.Context, resource string) (fencing.Checkpoint, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Checkpoint{}, err
	}
	var state []byte
	w, err := s.read(ctx, "read checkpoint", s.sql.readCheckpoint, resource, &state)
	if err != nil {
		return fencing.Checkpoint{}, err
	}
	r := w.record()
	if r.Saved != nil && state == nil {
		return fencing.Checkpoint{}, fmt.Errorf("pgstore: checkpoint metadata of %q has no state", resource)
	}
	return r.ReadCheckpoint(state, w.now())
}

// Status implements fencing.Store.
func (s *Store) Status(ctx context.Context, resource string) (fencing.Status, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Status{}, err
	}
	w, err := s.read(ctx, "status", s.sql.read, resource)
	if err != nil {
		return fencing.Status{}, err
	}
	return w.record().Status(resource, w.now()), nil
}

// Admit implements fencing.Store. An admission at the current mark (a
// holder writing with its token) is decided from one read-only statement
// and writes nothing; so is every refusal. Only a raise locks the row in a
// transaction, decides again (the mark may have moved since the read) and
// commits the new mark before returning.
func (s *Store) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	if err := req.Validate(); err != nil {
		return fencing.Admission{}, err
	}
	w, err := s.read(ctx, "admit", s.sql.read, req.Resource)
	if err != nil {
		return fencing.Admission{}, err
	}
	a, changed, err := s.admitRecord(w.record(), req, w.now())
	if err != nil || !changed {
		return a, err
	}
	return write(ctx, s, "admit", req.Resource, func(r *record.Record, now time.Time) (fencing.Admission, bool, error) {
		return s.admitRecord(r, req, now)
	}, nil)
}

// admitRecord decides an admission on r at the database's now: on a
// resource with no record, record.Absent at the clock; otherwise
// record.Record.Admit, touching the record when its touch is stale for the
// retention. changed says whether r must be written.
func (s *Store) admitRecord(r *record.Record, req fencing.AdmitRequest, now time.Time) (a fencing.Admission, changed bool, err error) {
	if !r.Exists() {
		return fencing.Admission{}, false, record.Absent(req, record.ClockMicros(now))
	}
	if a, err = r.Admit(req, now); err != nil {
		return a, false, err
	}
	touch := r.TouchStale(now, s.retention)
	if touch {
		r.Touch(now)
	}
	return a, a.Raised || touch, nil
}

// List implements fencing.Store: a range scan of the primary key from the
// prefix, skipping ended leases (a prefix with many ended leases costs more
// than the leases it returns).
func (s *Store) List(ctx context.Context, req fencing.ListRequest) ([]fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	var leases []fencing.Lease
	err := s.repeatable(ctx, "list", func(ctx context.Context) (err error) {
		leases, err = s.list(ctx, req)
		return err
	})
	return leases, err
}

func (s *Store) list(ctx context.Context, req fencing.ListRequest) ([]fencing.Lease, error) {
	rows, err := s.pool.Query(ctx, s.sql.list, req.Prefix, req.Prefix+"\x7f", req.EffectiveLimit(), req.After)
	if err != nil {
		return nil, err
	}
	leases := []fencing.Lease{}
	for rows.Next() {
		var (
			l             fencing.Lease
			token, ttl    int64
			acquired, exp time.Time
		)
		if err := rows.Scan(&l.Resource, &l.Owner, &token, &ttl, &acquired, &exp); err != nil {
			rows.Close()
			return nil, err
		}
		l.Token = fencing.Token(token)
		l.TTL = time.Duration(ttl) * time.Millisecond
		l.AcquiredAt, l.ExpiresAt = acquired.UTC(), exp.UTC()
		leases = append(leases, l)
	}
	return leases, rows.Err()
}
