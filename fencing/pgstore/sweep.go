package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
	"github.com/fencegate/fencegate/fencing/retention"
)

// RetentionStats implements fencing.Retainer. ClockBehind counts
// acquisitions that found a record's tokens more than a second ahead of
// the database's clock (a clock stepped back; see docs/stores.md).
func (s *Store) RetentionStats() fencing.RetentionStats { return s.stats.Snapshot() }

// Sweep runs one retention pass now (the background sweep runs them too)
// and reports how many records it removed. It does nothing without a
// retention.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	return retention.Run(ctx, s.sweep, &s.stats)
}

// sweep removes idle records, one transaction of at most s.batch rows at a
// time, until one locks fewer. Rows locked by an operation are skipped
// (SKIP LOCKED), so the sweep never waits for one and an operation waits
// at most for one transaction's row locks; every gate sweeping the same
// schema is harmless. Each transaction locks the idle rows (sweepLock)
// and then, in a second statement that sees every barrier entry
// registered before the locks, removes those that have none (sweepRemove):
// a write admitted on a record while the first statement ran keeps it.
func (s *Store) sweep(ctx context.Context) (int, error) {
	if s.retention <= 0 {
		return 0, nil
	}
	removed := 0
	for {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		locked, n, err := s.sweepBatch(ctx)
		if err != nil {
			return removed, classify("sweep", err, false)
		}
		removed += n
		if locked < s.batch {
			return removed, nil
		}
	}
}

// sweepBatch runs one sweep transaction and reports how many rows it
// locked as idle and how many of them it removed.
func (s *Store) sweepBatch(ctx context.Context) (locked, removed int, err error) {
	ctx, cancel, err := s.begin(ctx, "sweep")
	defer cancel()
	if err != nil {
		return 0, 0, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer s.rollback(ctx, tx)
	// The cut-off is taken on the database's clock, in the statement: $1
	// is the retention as an interval, with the slack of the admissions
	// whose touch was not written (record.Kept).
	rows, err := tx.Query(ctx, s.sql.sweepLock, record.Kept(s.retention), s.batch)
	if err != nil {
		return 0, 0, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		return 0, 0, err
	}
	var n int64
	if err := tx.QueryRow(ctx, s.sql.sweepRemove, names).Scan(&n); err != nil {
		return 0, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, err
	}
	return len(names), int(n), nil
}
