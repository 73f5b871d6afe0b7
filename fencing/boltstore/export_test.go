package boltstore

import bolt "go.etcd.io/bbolt"

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
