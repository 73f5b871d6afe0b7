package fencingtest

import (
	"errors"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// The clock cases (DESIGN §12): tokens on the store's clock, retention, a
// clock stepped back, a restore from an older copy.

func (s *suite) needClockTokens() {
	s.t.Helper()
	if !s.inst.ClockTokens {
		s.t.Skip("the store's tokens do not follow its clock")
	}
}

// wantAtClock fails unless l's token is at or above the store's clock when
// it was acquired (acquired_at, in µs; it is at millisecond precision, so
// at or below the instant the token was taken from).
func (s *suite) wantAtClock(l fencing.Lease) {
	s.t.Helper()
	if us := l.AcquiredAt.UnixMicro(); l.Token < fencing.Token(us) {
		s.t.Fatalf("lease %+v: token %d below the store's clock %d µs when it was acquired", l, l.Token, us)
	}
}

func testTokensFollowClock(s *suite) {
	s.needClockTokens()
	const res = "clock:tokens"
	a := s.acquire(res, "alice", longTTL)
	s.wantAtClock(a)
	// A fresh record starts at its first token: every token issued before
	// the record existed is stale, and refused with the mark at the clock.
	s.wantMarks(res, a.Token, 0)
	s.wantStale(res, a.Token-1, a.Token)
	s.admit(res, a.Token)
	s.release(a, false)
	s.advance(time.Hour)
	b := s.acquire(res, "bob", longTTL)
	s.wantAtClock(b)
	if b.Token <= a.Token {
		s.t.Fatalf("token %d after %d", b.Token, a.Token)
	}
}

// waitRetention lets the store's retention pass over what is idle now: it
// moves the clock (or sleeps) past the retention and runs a sweep where the
// store has one. It reports how many records the sweep removed (-1 without
// a sweep).
func (s *suite) waitRetention() int {
	s.t.Helper()
	ret := s.inst.Retention
	if s.realClock() {
		time.Sleep(ret + ret/2 + 100*time.Millisecond)
	} else {
		// A store may keep a record an eighth of the retention longer
		// (the slack of the admissions it leaves unwritten; docs/stores.md).
		s.inst.Advance(ret + ret/8 + time.Second)
	}
	if s.inst.Sweep == nil {
		return -1
	}
	n, err := s.inst.Sweep(s.ctx)
	if err != nil {
		s.t.Fatalf("Sweep: %v", err)
	}
	return n
}

func testRetentionRemovesIdle(s *suite) {
	if s.inst.Retention <= 0 {
		s.t.Skip("store opened without retention")
	}
	const idle, live = "ret:idle", "ret:live"
	a := s.acquire(idle, "alice", s.shortTTL())
	s.checkpoint(a, `{"step":1}`)
	s.admit(idle, a.Token)
	s.release(a, true)
	// A live lease outlasting the retention keeps its record.
	l := s.acquire(live, "lena", fencing.MaxTTL)
	if n := s.waitRetention(); n == 0 {
		s.t.Fatalf("Sweep removed nothing, want the idle record gone")
	}
	st := s.status(idle)
	if st.Issued != 0 || st.HighWater != 0 || st.Lease != nil || st.Previous != nil || st.Checkpoint != nil {
		s.t.Fatalf("status of a record past its retention %+v, want zeros and nils", st)
	}
	_, err := s.st.ReadCheckpoint(s.ctx, idle)
	s.wantErr("ReadCheckpoint of a removed record", err, fencing.ErrNoCheckpoint)
	// Every token issued before the removal stays refused: as stale where
	// tokens follow the clock.
	_, err = s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: idle, Token: a.Token})
	if !errors.Is(err, fencing.ErrStaleToken) && (s.inst.ClockTokens || !errors.Is(err, fencing.ErrTokenNotIssued)) {
		s.t.Fatalf("Admit of %d on a removed record: %v, want it refused as stale", a.Token, err)
	}
	b := s.acquire(idle, "bob", longTTL)
	if b.Token <= a.Token {
		s.t.Fatalf("token %d after the removal, want above %d, issued before it", b.Token, a.Token)
	}
	_, err = s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: idle, Token: a.Token})
	s.wantErr("Admit of a token issued before the removal", err, fencing.ErrStaleToken)
	s.admit(idle, b.Token)
	s.wantLeaseIs("live lease past the retention", s.status(live).Lease, l)
	if r := fencing.CapabilitiesOf(s.st).Retain; r != nil && s.inst.Sweep != nil {
		if got := r.RetentionStats(); got.Removed == 0 || got.Sweeps == 0 {
			s.t.Fatalf("RetentionStats %+v after a sweep that removed a record", got)
		}
	}
}

// testRetentionCountsFromTheExpiry: a holder that checkpointed and then
// crashed leaves a lease that outlives the retention; its record, with the
// checkpoint and how the lease ended, stays for the retention counted from
// the expiry, so the next holder can read them, and only then goes.
func testRetentionCountsFromTheExpiry(s *suite) {
	if s.inst.Retention <= 0 {
		s.t.Skip("store opened without retention")
	}
	const res = "ret:expired"
	ttl := max(2*s.inst.Retention, fencing.MinTTL)
	a := s.acquire(res, "alice", ttl)
	s.checkpoint(a, `{"step":3}`)
	// Past the expiry, well within the retention after it.
	if s.realClock() {
		time.Sleep(ttl + s.inst.Retention/4)
	} else {
		s.inst.Advance(ttl + s.inst.Retention/4)
	}
	if s.inst.Sweep != nil {
		if _, err := s.inst.Sweep(s.ctx); err != nil {
			s.t.Fatalf("Sweep: %v", err)
		}
	}
	st := s.status(res)
	if st.Previous == nil || st.Previous.Ended != fencing.EndExpired || st.Checkpoint == nil {
		s.t.Fatalf("status just after the lease expired %+v (previous %+v), want the expired lease and its checkpoint kept for the retention", st, st.Previous)
	}
	if n := s.waitRetention(); n == 0 {
		s.t.Fatalf("Sweep removed nothing a retention after the expiry")
	}
	if st := s.status(res); st.Issued != 0 || st.Previous != nil || st.Checkpoint != nil {
		s.t.Fatalf("status a retention after the expiry %+v, want zeros and nils", st)
	}
}

func testRetentionKeepsWrittenRecord(s *suite) {
	if s.inst.Retention <= 0 || s.realClock() {
		s.t.Skip("needs retention and a fake clock")
	}
	// Admissions at the mark keep a record whose lease ended: a holder
	// still writing with its token is not cut off by retention.
	const res = "ret:written"
	a := s.acquire(res, "alice", s.shortTTL())
	s.admit(res, a.Token)
	s.release(a, false)
	ret := s.inst.Retention
	sweep := func() int {
		s.t.Helper()
		n, err := s.inst.Sweep(s.ctx)
		if err != nil {
			s.t.Fatalf("Sweep: %v", err)
		}
		return n
	}
	for range 4 {
		s.inst.Advance(ret / 2)
		s.admit(res, a.Token)
		sweep()
	}
	s.wantMarks(res, a.Token, a.Token)
	// A store may leave an admission at the mark unwritten (its record's
	// touch is recent); the record still stays a whole retention after
	// that admission: half a retention after the last written one, then
	// a sixteenth.
	for _, after := range []time.Duration{ret / 2, ret / 16} {
		s.admit(res, a.Token)
		s.inst.Advance(after)
		s.admit(res, a.Token)
		s.inst.Advance(ret - time.Second)
		if n := sweep(); n != 0 {
			s.t.Fatalf("Sweep removed %d records, want the record admitted on %v ago (retention %v) kept", n, ret-time.Second, ret)
		}
		s.wantMarks(res, a.Token, a.Token)
	}
	// And it goes at most an eighth of the retention later than that.
	s.inst.Advance(ret/8 + 2*time.Second)
	if n := sweep(); n == 0 {
		s.t.Fatalf("Sweep removed nothing %v after the last admission (retention %v)", ret+ret/8+time.Second, ret)
	}
}

// testDeletedRecord: a record removed outside the store's API (as
// retention removes one) reads as never used; every token issued before it
// is refused as stale, without being taken for a loss of the store; the
// next token is above all of them.
func testDeletedRecord(s *suite) {
	s.needClockTokens()
	if s.inst.Delete == nil {
		s.t.Skip("the harness cannot delete a record")
	}
	const res, other = "deleted:r", "deleted:other"
	a := s.acquire(res, "alice", s.shortTTL())
	s.checkpoint(a, `{"step":1}`)
	s.admit(res, a.Token)
	s.release(a, true)
	o := s.acquire(other, "olga", longTTL)
	s.inst.Delete(s.t, res)
	s.advance(time.Second)
	st := s.status(res)
	if st.Issued != 0 || st.HighWater != 0 || st.Lease != nil || st.Previous != nil || st.Checkpoint != nil {
		s.t.Fatalf("status of a deleted record %+v, want zeros and nils", st)
	}
	_, err := s.st.ReadCheckpoint(s.ctx, res)
	s.wantErr("ReadCheckpoint of a deleted record", err, fencing.ErrNoCheckpoint)
	for range 2 { // the first refusal changed nothing
		_, err = s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: a.Token})
		if !errors.Is(err, fencing.ErrStaleToken) || errors.Is(err, fencing.ErrStoreLost) {
			s.t.Fatalf("Admit of %d on a deleted record: %v, want stale (not a lost store)", a.Token, err)
		}
	}
	b := s.acquire(res, "bob", longTTL)
	s.wantAtClock(b)
	if b.Token <= a.Token {
		s.t.Fatalf("token %d after the deletion, want above %d, issued before it", b.Token, a.Token)
	}
	_, err = s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: a.Token})
	if !errors.Is(err, fencing.ErrStaleToken) || errors.Is(err, fencing.ErrStoreLost) {
		s.t.Fatalf("Admit of %d after the record was created again: %v, want stale", a.Token, err)
	}
	// The new holder is not cut off: its writes, renewal and release work.
	s.admit(res, b.Token)
	s.admit(res, b.Token)
	s.wantMarks(res, b.Token, b.Token)
	if _, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "bob", Token: b.Token}); err != nil {
		s.t.Fatalf("Renew after the deletion: %v", err)
	}
	s.release(b, false)
	s.wantLeaseIs("another resource's lease", s.status(other).Lease, o)
}

func testClockSteppedBack(s *suite) {
	s.needClockTokens()
	if s.inst.Rewind == nil {
		s.t.Skip("the store's clock cannot be moved back")
	}
	const res, fresh = "back:a", "back:b"
	a := s.acquire(res, "alice", s.shortTTL())
	s.admit(res, a.Token)
	s.release(a, false)
	s.inst.Rewind(time.Hour)
	b := s.acquire(res, "bob", longTTL)
	if b.Token <= a.Token {
		s.t.Fatalf("token %d after the clock stepped back, want above %d", b.Token, a.Token)
	}
	// A fresh record is not taken back with the clock either.
	f := s.acquire(fresh, "fred", longTTL)
	if f.Token < a.Token {
		s.t.Fatalf("fresh record's token %d after the clock stepped back, below %d issued before", f.Token, a.Token)
	}
	if r := fencing.CapabilitiesOf(s.st).Retain; r != nil {
		if got := r.RetentionStats(); got.ClockBehind == 0 {
			s.t.Fatalf("RetentionStats %+v: the step back was not detected", got)
		}
	}
}

// testRemovalAfterClockSteppedBack: while the clock is behind, a record
// created afresh issues tokens above the clock, one after another; once
// retention removes it (the clock still behind them: stepped back further
// than the retention), the record created again must start above every one
// of them.
func testRemovalAfterClockSteppedBack(s *suite) {
	s.needClockTokens()
	if s.inst.Rewind == nil || s.inst.Sweep == nil || s.inst.Retention <= 0 || s.realClock() {
		s.t.Skip("the store's clock cannot be moved back, or it has no retention sweep")
	}
	const res = "back:removed"
	a := s.acquire("back:before", "alice", s.shortTTL())
	s.release(a, false)
	s.inst.Rewind(3 * s.inst.Retention) // still behind after the retention
	b := s.acquire(res, "bob", s.shortTTL())
	s.admit(res, b.Token)
	s.release(b, false)
	c := s.acquire(res, "carol", s.shortTTL()) // then lost: it expires
	s.advance(s.shortTTL())
	if n := s.waitRetention(); n < 1 {
		s.t.Fatalf("the sweep removed nothing, want the idle record gone: %+v", s.status(res))
	}
	d := s.acquire(res, "dave", longTTL)
	if d.Token <= c.Token {
		s.t.Fatalf("token %d after the record was removed, want above %d and %d, issued for it before", d.Token, b.Token, c.Token)
	}
	for _, old := range []fencing.Token{b.Token, c.Token} {
		_, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: old})
		if !errors.Is(err, fencing.ErrStaleToken) {
			s.t.Fatalf("Admit of %d, issued before the removal: %v, want stale", old, err)
		}
	}
}

func testRestoreFromOlderCopy(s *suite) {
	s.needClockTokens()
	if s.inst.Backup == nil {
		s.t.Skip("the store has no copy to restore")
	}
	const res, later = "restore:r", "restore:later"
	a := s.acquire(res, "alice", s.shortTTL())
	s.checkpoint(a, `{"step":1}`)
	s.admit(res, a.Token)
	s.release(a, false)
	restore := s.inst.Backup(s.t)
	// After the backup: more tokens, on the same resource and a new one.
	s.advance(time.Minute)
	var issued []fencing.Token
	for _, owner := range []string{"bob", "carol"} {
		l := s.acquire(res, owner, s.shortTTL())
		s.admit(res, l.Token)
		s.release(l, false)
		issued = append(issued, l.Token)
	}
	n := s.acquire(later, "nina", s.shortTTL())
	s.admit(later, n.Token)
	s.advance(time.Minute)
	s.st = restore(s.t)
	// Nothing issued since the backup is admitted, and the next tokens are
	// above all of it.
	for _, tok := range issued {
		if _, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: tok}); err == nil {
			s.t.Fatalf("token %d admitted right after the restore", tok)
		}
	}
	if _, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: later, Token: n.Token}); err == nil {
		s.t.Fatalf("token %d of a resource created after the backup admitted after the restore", n.Token)
	}
	d := s.acquire(res, "dave", longTTL)
	top := issued[len(issued)-1]
	if d.Token <= top {
		s.t.Fatalf("token %d after the restore, repeating one issued since the backup (up to %d)", d.Token, top)
	}
	s.admit(res, d.Token)
	for _, tok := range append(issued, a.Token) {
		_, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: tok})
		s.wantErr("Admit of a token issued before the restore", err, fencing.ErrStaleToken)
	}
	m := s.acquire(later, "mia", longTTL)
	if m.Token <= n.Token {
		s.t.Fatalf("token %d of a resource created after the backup, repeating %d", m.Token, n.Token)
	}
	_, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: later, Token: n.Token})
	if !errors.Is(err, fencing.ErrStaleToken) {
		s.t.Fatalf("Admit of %d, issued before the restore: %v, want stale", n.Token, err)
	}
}
