package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/retention"
)

// Backup writes a consistent copy of the store file to w, taken in one
// read transaction while the store runs (bbolt's Tx.WriteTo). A restore
// of it is detected as a loss only when the lineage marker beside the
// file is not restored with it. Either way no token issued after the copy
// is admitted after the restore (see lineage.go); but restored with its
// marker, the copy's leases and marks come back, and a holder at the
// copy's moment can write again after newer writes: restore the file
// alone.
func (s *Store) Backup(w io.Writer) error {
	return s.view(context.Background(), func(tx *bolt.Tx) error {
		_, err := tx.WriteTo(w)
		return err
	})
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
// record inFlight reports, whatever its age. It asks inFlight in the
// transaction that would remove the record, after dropping the record's
// mark-cache entry and with the resource in s.removing (Admit then
// decides in the group commit, after the removal's call), so a write
// registered before its admission either is seen by inFlight, and keeps its
// record, or reads the removal and is refused: no write is admitted on a
// record the sweep then removes. It costs the admissions nothing: only
// the sweep and the admissions that miss the mark cache during a removal
// call look.
func (s *Store) KeepInFlight(inFlight func(resource string) bool) {
	if inFlight == nil {
		s.inFlight.Store(nil)
		return
	}
	s.inFlight.Store(&inFlight)
}

// beingRemoved reports whether the running sweep call may remove
// resource's record (s.removing).
func (s *Store) beingRemoved(resource string) bool {
	m := s.removing.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[resource]
	return ok
}

// maxSweepRemovals bounds the records one sweep call removes, and so what
// it adds to the group commit that carries it (its deletions and the pages
// they dirty).
const maxSweepRemovals = 256

// sweep walks the records in key order, s.batch records per read
// transaction, and removes the idle ones (record.Record.Idle at the
// store's clock) with no write in flight (KeepInFlight) with their
// checkpoint state, in calls of at most
// maxSweepRemovals records run by the group committer (group.go): each
// call queues behind the writes waiting before it and shares their
// transaction and flush, so a sweep over many records holds no write for
// longer than one bounded call, and admissions at the mark (read from the
// mark cache) not at all.
//
// A record the scan found idle may be written to before its call runs
// (an acquisition, a renewal, an admission's touch): the call reads every
// record again in its own transaction and removes only those still idle
// then (decoding again only a record whose bytes changed since the scan,
// or all of them if the clock went back behind it: see sweepRemove), so a
// write ordered before the removal keeps the record and one
// ordered after it finds no record and starts a fresh one above every
// token the removed record issued (keySwept, tokenClock).
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
		idle, scanned, next, err := s.sweepScan(from)
		if err != nil {
			return removed, s.classify(err, false)
		}
		if s.hooks.sweepScanned != nil {
			keys := make([][]byte, len(idle))
			for i, f := range idle {
				keys[i] = f.key
			}
			s.hooks.sweepScanned(keys)
		}
		for len(idle) > 0 {
			chunk := idle[:min(len(idle), maxSweepRemovals)]
			idle = idle[len(chunk):]
			n, err := s.sweepRemove(ctx, chunk, scanned)
			removed += n
			if err != nil {
				return removed, err
			}
		}
		if next == nil {
			return removed, nil
		}
		from = next
	}
}

// idleRecord is a record a sweep scan found idle: its key, its stored
// bytes as the scan read them (copies: bbolt's slices are valid only in
// their transaction) and its Issued once lifted to the store's floor.
type idleRecord struct {
	key, raw []byte
	issued   fencing.Token
}

// sweepScan examines at most s.batch records from key from (nil: the
// first) in one read transaction and returns the idle ones, the clock
// reading they were found idle at, and the key to start the next scan
// at, nil when the walk is done.
func (s *Store) sweepScan(from []byte) (idle []idleRecord, scanned time.Time, next []byte, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		now := s.clock.Now()
		scanned = now
		c := tx.Bucket(bucketRecords).Cursor()
		k, v := c.First()
		if from != nil {
			k, v = c.Seek(from)
		}
		for i := 0; k != nil && i < s.batch; i++ {
			r, err := decode(string(k), v)
			if err != nil {
				return err
			}
			r.Lift(s.floor, now)
			if r.Idle(now, s.retention) {
				idle = append(idle, idleRecord{key: bytes.Clone(k), raw: bytes.Clone(v), issued: r.Issued})
			}
			k, v = c.Next()
		}
		if k != nil {
			next = bytes.Clone(k)
		}
		return nil
	})
	return idle, scanned, next, err
}

// sweepRemove removes, in one call of a group commit, those of the
// records a scan at scanned found idle that are still idle when the call
// runs, and returns how many it removed once they are committed. Keys
// whose record is gone or no longer idle are left alone.
//
// A record whose stored bytes are those the scan read, at a clock reading
// not behind the scan's (in Unix milliseconds, the records' unit), is
// still idle without being decoded again: the floor is set at Open only,
// so it lifts the same record the same way, and a record idle at one
// reading is idle at every later one (its lease stays expired and its
// last touch only gets older). Changed bytes, or a clock stepped back
// behind the scan, have the record decoded and checked again.
func (s *Store) sweepRemove(ctx context.Context, idle []idleRecord, scanned time.Time) (int, error) {
	removed := 0
	var inFlight func(string) bool
	if f := s.inFlight.Load(); f != nil {
		inFlight = *f
		names := make(map[string]struct{}, len(idle))
		for _, f := range idle {
			names[string(f.key)] = struct{}{}
		}
		// Published before the call asks inFlight, withdrawn once its
		// commit has returned (see KeepInFlight).
		s.removing.Store(&names)
		defer s.removing.Store(nil)
	}
	c := &call{sweep: func(tx *bolt.Tx, now time.Time) (bool, error) {
		removed = 0 // run again after a neighbour's failure: count afresh
		recs, states := tx.Bucket(bucketRecords), tx.Bucket(bucketStates)
		top := fencing.Token(s.swept.Load())
		notBehind := now.UnixMilli() >= scanned.UnixMilli()
		for _, f := range idle {
			key := f.key
			v := recs.Get(key)
			if v == nil {
				continue
			}
			issued := f.issued
			if !notBehind || !bytes.Equal(v, f.raw) {
				r, err := decode(string(key), v)
				if err != nil {
					return false, err
				}
				r.Lift(s.floor, now)
				if !r.Idle(now, s.retention) {
					continue // written to since the scan, or the clock stepped back
				}
				issued = r.Issued
			}
			// Before the commit, and before inFlight is asked: no
			// admission is answered from the removed record once it is
			// gone. An idle record's entry answers none anyway (its
			// touch is stale), so dropping it for a record kept costs
			// nothing.
			s.marks.forget(string(key))
			if inFlight != nil && inFlight(string(key)) {
				continue // a write in flight through the gate
			}
			top = max(top, issued)
			if err := recs.Delete(key); err != nil {
				return false, err
			}
			if err := states.Delete(key); err != nil {
				return false, err
			}
			removed++
		}
		if removed == 0 {
			return false, nil
		}
		// Fresh records must start above what went: counting from one, and
		// on the clock too, which may be behind tokens a removed record
		// issued (stepped back further than the retention). The file's
		// mark is compared, not the one in memory: that one may have been
		// raised by a run of this call (or an earlier sweep) whose
		// transaction did not commit, and the removal committed now must
		// still carry the mark to the file, or a restart would start
		// fresh records below tokens it issued.
		meta := tx.Bucket(bucketMeta)
		var onFile fencing.Token
		if v := meta.Get(keySwept); len(v) == 8 {
			onFile = fencing.Token(binary.BigEndian.Uint64(v))
		}
		if top > onFile {
			if err := meta.Put(keySwept, binary.BigEndian.AppendUint64(nil, uint64(top))); err != nil {
				return false, err
			}
		}
		if top > fencing.Token(s.swept.Load()) {
			// Raised before the commit: an acquisition that follows it,
			// in this transaction or a later one, must see it, and one
			// that fails leaves it only higher.
			s.swept.Store(uint64(top))
		}
		return true, nil
	}}
	if err := s.do(ctx, c); err != nil {
		return 0, err
	}
	return removed, nil
}
