package boltstore

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
