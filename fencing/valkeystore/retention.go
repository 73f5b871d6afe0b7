package valkeystore

import (
	"math"
	"time"
)

// Retention (Options.Retention, DESIGN §12) is key expiry: the server
// removes what is idle, the store never scans.
//
//   - Every script that changes a record (acquire, renew, release,
//     checkpoint, lift) sets the TTL of the record hash P:{R} and of its
//     checkpoint state P:{R}:state to keptFor(retention) (the retention
//     and a margin of two slacks, below) past the later of now
//     and the end of the live lease, and not before the last entry of
//     P:{R}:bar (lua/lib.lua, fg_keep; the scripts receive all three
//     keys in KEYS). A live lease
//     therefore always outlives nothing: its record expires no sooner than
//     the retention after the lease ends, by release or expiry. P:{R}:live
//     expires with the lease and P:{R}:bar with its last barrier entry, as
//     before.
//   - An admission keeps the record too, but it must not write on every
//     call: admit.lua rewrites the TTL only when it is more than the slack
//     (keepSlack) short of the retention, and the admissions answered
//     without a script (AdmitBatch's read of the marks, the mark readers)
//     are answered so only for a resource whose TTL this Store had a script
//     check less than the slack ago (keptRecently); the others run
//     admit.lua, whose Store.now when sent is the check's time. So a
//     record admitted on keeps at least keptFor(retention) - 2 × slack,
//     never less than the retention, ahead of the admission: a whole
//     retention after its last operation, at most 2 s more.
//   - A record removed by expiry reads as never used (status with zeros,
//     no checkpoint). Tokens follow the server clock, so every token issued
//     before the removal is below the clock: admit.lua refuses it as stale
//     (FLOOR) and a record created afresh starts with its floor at the
//     clock, above it (acquire.lua). seen.go does not take such a record
//     for a loss: its floor is at or above every token this Store saw on it.
//   - Retention 0 keeps records for ever: a TTL an earlier retention set is
//     removed (PERSIST) by the next script that writes the record.
//   - Removals are counted by the server (INFO stats, expired_keys; three
//     keys at most per resource), not by the store.

// keptFor is how long the scripts keep a record past its last operation
// (the TTL they give it, and the retention argument they get): the
// retention, and two of keepSlack(keptFor) on top for the admissions that
// do not rewrite it: a quarter of the retention, at most 2 s. 0 (keep
// forever) stays 0; a sum past the longest duration is the longest.
func keptFor(retention time.Duration) time.Duration {
	if retention <= 0 {
		return 0
	}
	k := retention + min(retention/4, 2*time.Second)
	if k < retention {
		k = math.MaxInt64
	}
	return k.Truncate(time.Millisecond)
}

// keepSlack is how far a record's TTL may fall behind keptFor's before an
// admission rewrites it: a sixteenth of it, at most one second (fg_slack
// in lua/lib.lua is the same rule, on the same argument).
func keepSlack(retention time.Duration) time.Duration {
	if retention <= 0 {
		return time.Second
	}
	return min(retention/16, time.Second).Truncate(time.Millisecond)
}

// clockStart anchors Store.now on the monotonic clock.
var clockStart = time.Now()

// now is the time since clockStart, monotonic, for seenMarks.kept.
func (s *Store) now() time.Duration { return time.Since(clockStart) }

// keptRecently reports whether an admission at the mark on a resource seen
// as before may be answered without a script: a script applied the
// retention to its record (fg_keep) less than the slack ago.
func (s *Store) keptRecently(before seenRecord, known bool) bool {
	return known && before.keptAt > 0 && s.now()-before.keptAt < s.slack
}

// admitKeys are admit.lua's (and admit_register.lua's) keys for res: the
// record, its checkpoint state (whose expiry follows the record's) and
// the barrier entries (the record outlives them; fg_keep reads their TTL).
func (s *Store) admitKeys(res string) []string {
	return []string{s.recKey(res), s.stateKey(res), s.barKey(res)}
}
