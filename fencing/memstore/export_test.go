package memstore

// DeleteRecord removes a resource's record and checkpoint behind the
// store's API, as its retention removes them (the conformance suite's
// DeletedRecord case).
func DeleteRecord(s *Store, res string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.records, res)
	delete(s.states, res)
}
