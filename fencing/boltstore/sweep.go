package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"

	bolt "go.etcd.io/bbolt"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/retention"
)

// Backup writes a consistent copy of the store file to w, taken in one
// read transaction while the store runs (bbolt's Tx.WriteTo). A restore
// of it is detected as a loss only when the lineage marker beside the
// file is not restored with it; either way no token issued after the copy
// is admitted after the restore (see lineage.go).
func (s *Store) Backup(w io.Writer) error {
	return s.classify(s.db.View(func(tx *bolt.Tx) error {
		_, err := tx.WriteTo(w)
		return err
	}), false)
}

// RetentionStats implements fencing.Retainer.
func (s *Store) RetentionStats() fencing.RetentionStats { return s.stats.Snapshot() }

// Sweep runs one retention pass now (the background sweep runs them too)
// and reports how many records it removed. It does nothing without a
// retention.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	return retention.Run(ctx, s.sweep, &s.stats)
}

// sweep walks the records in key order, one write transaction per batch
// of s.batch records, removing the idle ones (record.Record.Idle at the
// store's clock) with their checkpoint state. Between batches nothing is
// held, so acquisitions and raises wait for one batch at most, and
// admissions at the mark not at all (they read the mark cache).
func (s *Store) sweep(ctx context.Context) (int, error) {
	if s.retention <= 0 {
		return 0, nil
	}
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	removed := 0
	var from []byte
	for {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		n, next, err := s.sweepBatch(from)
		removed += n
		if err != nil {
			return removed, s.classify(err, n > 0)
		}
		if next == nil {
			return removed, nil
		}
		from = next
	}
}

// errNothingSwept rolls back a batch that removed nothing, sparing its
// commit's flush.
var errNothingSwept = errors.New("boltstore: nothing swept")

// sweepBatch examines at most s.batch records from key from (nil: the
// first) in one write transaction and removes the idle ones. It returns
// the key to start the next batch at, nil when the walk is done.
func (s *Store) sweepBatch(from []byte) (removed int, next []byte, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		now := s.clock.Now()
		recs, states := tx.Bucket(bucketRecords), tx.Bucket(bucketStates)
		c := recs.Cursor()
		k, v := c.First()
		if from != nil {
			k, v = c.Seek(from)
		}
		var idle [][]byte
		top := fencing.Token(s.swept.Load())
		for i := 0; k != nil && i < s.batch; i++ {
			r, err := decode(string(k), v)
			if err != nil {
				return err
			}
			r.Lift(s.floor, now)
			if r.Idle(now, s.retention) {
				idle = append(idle, bytes.Clone(k))
				top = max(top, r.Issued)
			}
			k, v = c.Next()
		}
		if k != nil {
			next = bytes.Clone(k)
		}
		if len(idle) == 0 {
			return errNothingSwept
		}
		for _, key := range idle {
			if err := recs.Delete(key); err != nil {
				return err
			}
			if err := states.Delete(key); err != nil {
				return err
			}
			s.marks.forget(string(key))
		}
		if top > fencing.Token(s.swept.Load()) {
			// Fresh records must start above what went: counting from one,
			// and on the clock too, which may be behind tokens a removed
			// record issued (stepped back further than the retention).
			if err := tx.Bucket(bucketMeta).Put(keySwept, binary.BigEndian.AppendUint64(nil, uint64(top))); err != nil {
				return err
			}
			// Raised before the commit: an acquisition that follows it
			// must see it, and one that fails leaves it only higher.
			s.swept.Store(uint64(top))
		}
		removed = len(idle)
		return nil
	})
	if errors.Is(err, errNothingSwept) {
		err = nil
	}
	if err != nil {
		removed = 0
	}
	return removed, next, err
}
