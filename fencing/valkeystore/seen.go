package valkeystore

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// Loss of Valkey's data, seen from the gate.
//
// Tokens follow the server clock (acquire.lua), which keeps them unique
// across a loss only while the clock of the node serving after the loss is
// not behind the tokens issued before it. A node whose clock was ahead can
// issue X; after a FLUSHALL (or a restart without persistence, a failover to
// an empty or lagging replica) a node with a correct clock would issue
// T1 < X, admit T1's write, and later, once its clock passes X, admit X
// again after T1's write.
//
// So each Store remembers what it has seen the server answer:
//
//   - the highest token issued or admitted on any resource (one number), sent
//     with every acquisition as a floor hint: a record created afresh (never
//     used, or lost whole) starts above it, so the first token after a loss
//     is above every token this process saw before it, whatever the clocks;
//   - per resource, the highest issued token seen, the highest high-water
//     mark seen and the record's floor, in a bounded table (maxSeenResources
//     entries; when full, the oldest entries are dropped, and only the
//     global floor hint protects those resources). The floor changes only
//     when a record is created afresh or lifted. An admission answer whose
//     issued counter or mark is below the one seen under the same floor (a
//     lost raise would put a superseded token at the mark again), or whose
//     floor differs and is below the issued token seen, means the record
//     lost writes or was lost whole and re-created (by another gate) below
//     tokens issued before: Admit then lifts the record past the floor hint (lift.lua) and fails with
//     fencing.ErrStoreLost, so neither the pre-loss token nor a post-loss
//     token below it is forwarded, through any gate; the next acquisition
//     issues a token above both. Acquire sends the resource's issued token
//     too, and acquire.lua lifts a record that went back before issuing.
//
// Retention removes records (retention.go), so a record that is gone, or
// re-created with a floor at or above the issued token seen, is not a
// loss: it refuses every token this Store saw on it (by the server's clock
// while it is gone, by its floor once re-created), whatever removed it. A
// whole loss with sane clocks is therefore no longer reported, only made
// harmless; one re-created below what was seen still is (see lost), and so
// is a record that is gone when a token this Store saw issued on it is at
// or above the server's clock (admit.lua answers "not issued" rather than
// stale for it: the clock cannot refuse it; see Store.admitted).
//
// Limits: the memory is per process and starts empty, so a gate restarted
// after the loss knows nothing of the time before it and relies on the
// clocks. Through a gate that never saw a resource before the loss, a
// pre-loss token issued by a node whose clock was ahead can still be
// admitted once the post-loss counter passes it, unless a gate that saw the
// resource has lifted the record first (which it does on its first
// admission for that resource after the loss).

// maxSeenResources bounds the per-resource table (about 100 bytes an
// entry).
const maxSeenResources = 1 << 16

// seenRecord is what a Store last saw of one resource's record.
type seenRecord struct {
	issued fencing.Token // the highest issued token seen
	hw     fencing.Token // the highest high-water mark seen under floor (0: none)
	floor  fencing.Token // the record's floor (changes only when the record is created afresh or lifted)
	keptAt time.Duration // Store.now when a script last applied the retention to it (0: never; see retention.go)
}

// seenMarks is a Store's memory of the tokens the server answered. Safe for
// concurrent use.
type seenMarks struct {
	top atomic.Uint64 // highest token seen, any resource

	mu    sync.Mutex
	byRes map[string]seenRecord
	order []string // insertion order, for dropping the oldest
	next  int      // next slot of order to overwrite once full
}

func newSeenMarks() *seenMarks {
	return &seenMarks{byRes: make(map[string]seenRecord)}
}

func (m *seenMarks) raiseTop(tok fencing.Token) {
	for {
		cur := m.top.Load()
		if uint64(tok) <= cur || m.top.CompareAndSwap(cur, uint64(tok)) {
			return
		}
	}
}

// put stores rec for res; m.mu is held.
func (m *seenMarks) put(res string, rec seenRecord) {
	if _, ok := m.byRes[res]; !ok {
		if len(m.order) < maxSeenResources {
			m.order = append(m.order, res)
		} else {
			delete(m.byRes, m.order[m.next])
			m.order[m.next] = res
			m.next = (m.next + 1) % maxSeenResources
		}
	}
	m.byRes[res] = rec
}

// lost reports whether an answer for res (its issued counter, high-water
// mark and floor; hw 0 when the answer does not carry the mark) shows that
// the record lost writes since before, the snapshot of what was seen taken
// before the call was sent:
//
//   - the same record (same floor) whose issued counter or high-water mark
//     went back: rolled back (the mark alone goes back when the store lost
//     only the admission that raised it, say to a newer holder's token
//     issued before the loss: the superseded token would be at the mark
//     again);
//   - another floor (the record was created afresh, or lifted) below the
//     highest token seen on it: created again below tokens issued before,
//     which its floor does not refuse (a loss re-created by a node whose
//     clock is behind them, or through a gate that never saw them).
//
// A record with another floor at or above every token seen on it is not a
// loss: it was removed (retention, or lost) and created again on the clock,
// or lifted by another gate, and refuses every token seen before. Neither
// is a record that does not exist (issued 0): removed by retention or lost,
// every token before it is refused until it is created again (admit.lua),
// and its creation is judged by its floor, as above.
//
// Comparing with the snapshot, not with what was seen when the answer
// arrives, keeps concurrent calls whose answers arrive out of order from
// looking like a loss: the server ran this call after every call whose
// answer was in before it was sent.
func (before seenRecord) lost(known bool, issued, hw, floor fencing.Token) bool {
	if !known || issued == 0 {
		return false
	}
	if floor == before.floor {
		return issued < before.issued || hw != 0 && hw < before.hw
	}
	return floor < before.issued
}

// observe remembers an answer for res (hw 0 when it does not carry the
// high-water mark): it replaces what was seen unless what was seen is newer
// (a higher issued counter; answers may arrive out of order), and keeps the
// highest mark seen under the same floor.
//
// An answer with issued 0 is a record that does not exist (never used, or
// lost whole): there is nothing to remember of it. Remembering it would
// make the record's creation by the next acquisition (with a floor of its
// own) look like a loss, and the lift would end that live lease.
func (m *seenMarks) observe(res string, issued, hw, floor fencing.Token) {
	if issued == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	seen, ok := m.byRes[res]
	switch {
	case !ok || issued >= seen.issued:
		rec := seenRecord{issued: issued, hw: hw, floor: floor, keptAt: seen.keptAt}
		if ok && floor == seen.floor {
			rec.hw = max(hw, seen.hw)
		}
		if !ok || rec != seen { // most answers change nothing
			m.put(res, rec)
		}
	case floor == seen.floor && hw > seen.hw:
		seen.hw = hw
		m.byRes[res] = seen
	}
	m.raiseTop(issued)
}

// kept notes that a script applied the retention to res's record at now
// (Store.now), if res is remembered.
func (m *seenMarks) kept(res string, now time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec, ok := m.byRes[res]; ok {
		rec.keptAt = now
		m.byRes[res] = rec
	}
}

// resource returns what was seen of res, and whether anything was.
func (m *seenMarks) resource(res string) (seenRecord, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.byRes[res]
	return rec, ok
}

// floor is the highest token seen on any resource.
func (m *seenMarks) floor() fencing.Token { return fencing.Token(m.top.Load()) }
