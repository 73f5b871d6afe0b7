package boltstore

import (
	"sync"

	"github.com/fencegate/fencegate/fencing/record"
)

// maxMarks bounds the mark cache: beyond it, resources not yet cached are
// admitted through a read transaction, as before the cache (about 150
// bytes an entry: a few MiB at most).
const maxMarks = 1 << 14

// marks caches, per resource, the record as last committed, so that an
// admission at the high-water mark (the gate's common case) is answered
// without a read transaction, a decode or an allocation.
//
// Only the store's write transactions fill it (a read transaction cannot
// know whether a write committed after it read), and an entry is published
// in two steps so that it never shows a state bbolt's readers do not:
// inside the write transaction, after the record is saved, the entry is
// replaced by a pending one (readers that find it pending read the file);
// once the transaction has committed, the entry is marked committed, if no
// later transaction replaced it meanwhile; if the commit failed, the entry
// is dropped. Entries are immutable once published.
type marks struct {
	mu      sync.RWMutex
	entries map[string]*markEntry
}

type markEntry struct {
	rec     record.Record // Prior and Saved nil; Last a private copy
	txid    int           // the write transaction that saved rec
	pending bool          // not yet known to be committed
}

// get returns the committed record of resource, if cached.
func (m *marks) get(resource string) (*markEntry, bool) {
	m.mu.RLock()
	e := m.entries[resource]
	m.mu.RUnlock()
	return e, e != nil && !e.pending
}

// saving publishes r, saved by write transaction txid, as pending. It runs
// inside that transaction.
func (m *marks) saving(resource string, r *record.Record, txid int) {
	e := &markEntry{rec: record.Record{Issued: r.Issued, HighWater: r.HighWater, Floor: r.Floor, TouchedMs: r.TouchedMs}, txid: txid, pending: true}
	if r.Last != nil {
		last := *r.Last
		e.rec.Last = &last
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries == nil {
		m.entries = map[string]*markEntry{}
	}
	if _, ok := m.entries[resource]; !ok && len(m.entries) >= maxMarks {
		return
	}
	m.entries[resource] = e
}

// settled ends write transaction txid's pending entry for resource:
// committed when the transaction committed, dropped when it did not.
func (m *marks) settled(resource string, txid int, committed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[resource]
	if e == nil || e.txid != txid || !e.pending {
		return // a later transaction replaced it, or never cached
	}
	if !committed {
		delete(m.entries, resource)
		return
	}
	done := *e
	done.pending = false
	m.entries[resource] = &done
}

// forget drops resource's entry; a write transaction that removes the
// resource's record calls it before committing, so that no admission is
// answered from the removed record afterwards (until the commit, readers
// that miss the cache read the file, which still has the record).
func (m *marks) forget(resource string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.entries, resource)
}
