package boltstore

import (
	"bytes"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// SetHooks installs test hooks on s before it is used: afterSave runs
// after each call of a group saved its record (an error fails that call as
// a storage failure would); beforeCommit runs before each group commits,
// with the number of calls in it. Either may be nil.
func SetHooks(s *Store, afterSave func(resource string) error, beforeCommit func(calls int)) {
	s.hooks = hooks{afterSave: afterSave, beforeCommit: beforeCommit}
}

// Queued is the number of calls waiting for the next group.
func Queued(s *Store) int {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// DeleteRecord removes a resource's record and checkpoint behind the
// store's API, as its retention removes them (the conformance suite's
// DeletedRecord case).
func DeleteRecord(s *Store, res string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketRecords).Delete([]byte(res)); err != nil {
			return err
		}
		return tx.Bucket(bucketStates).Delete([]byte(res))
	})
	s.marks.forget(res)
	return err
}

// DataSize is how much of the store file bbolt has used: the end of its
// highest page in use or freed (a transaction's Size). The file itself
// grows in steps beyond it (doubling up to bbolt's allocation size), so
// this is what shows whether freed pages are reused.
func DataSize(s *Store) int64 {
	var n int64
	_ = s.db.View(func(tx *bolt.Tx) error {
		n = tx.Size()
		return nil
	})
	return n
}

// CopyRecord stores the record (and checkpoint state, if any) of from
// under each of names, bypassing the store's API, in transactions of at
// most 10,000 names: a quick way to fill a file with many records exactly
// as the API writes them.
func CopyRecord(s *Store, from string, names []string) error {
	for len(names) > 0 {
		chunk := names[:min(len(names), 10000)]
		names = names[len(chunk):]
		err := s.db.Update(func(tx *bolt.Tx) error {
			recs, states := tx.Bucket(bucketRecords), tx.Bucket(bucketStates)
			v, st := bytes.Clone(recs.Get([]byte(from))), bytes.Clone(states.Get([]byte(from)))
			if v == nil {
				return fmt.Errorf("no record %q", from)
			}
			for _, n := range chunk {
				if err := recs.Put([]byte(n), v); err != nil {
					return err
				}
				if st != nil {
					if err := states.Put([]byte(n), st); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// SetSweepHook makes f run after each scan of a sweep pass, before the
// pass removes what it found, with the names of the records the scan
// found idle. Set before the store is used.
func SetSweepHook(s *Store, f func(idle []string)) {
	s.hooks.sweepScanned = func(idle [][]byte) {
		names := make([]string, len(idle))
		for i, k := range idle {
			names[i] = string(k)
		}
		f(names)
	}
}
