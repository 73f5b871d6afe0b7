package pgstore

import (
	"context"

	"github.com/fencegate/fencegate/fencing"
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

// sweep removes idle records, one statement (its own transaction) of at
// most s.batch rows at a time, until a statement removes fewer. Rows
// locked by an operation are skipped (SKIP LOCKED), so the sweep never
// waits for one and an operation waits at most for one statement's row
// locks; every gate sweeping the same schema is harmless.
func (s *Store) sweep(ctx context.Context) (int, error) {
	if s.retention <= 0 {
		return 0, nil
	}
	removed := 0
	for {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		var n int64
		err := func() error {
			ctx, cancel, err := s.begin(ctx, "sweep")
			defer cancel()
			if err != nil {
				return err
			}
			// The cut-off is taken on the database's clock, in the
			// statement: $1 is the retention as an interval.
			return s.pool.QueryRow(ctx, s.sql.sweep, s.retention, s.batch).Scan(&n)
		}()
		if err != nil {
			return removed, classify("sweep", err, false)
		}
		removed += int(n)
		if int(n) < s.batch {
			return removed, nil
		}
	}
}
