package fencingtest

import (
	"time"

	"github.com/fencegate/fencegate/fencing"
)

func (s *suite) readCheckpoint(res string) fencing.Checkpoint {
	s.t.Helper()
	cp, err := s.st.ReadCheckpoint(s.ctx, res)
	if err != nil {
		s.t.Fatalf("ReadCheckpoint(%q): %v", res, err)
	}
	return cp
}

func testCheckpointSavesAndRenews(s *suite) {
	const res = "cp:saves"
	const state = `{"step":3,"items":["a","b"],"note":"x\u00e9"}`
	l := s.acquire(res, "alice", 30*time.Second)
	s.advance(10 * time.Second)
	c := s.checkpoint(l, state)
	if c.TTL != l.TTL {
		s.t.Fatalf("Checkpoint changed the TTL %v -> %v", l.TTL, c.TTL)
	}
	if c.ExpiresAt.Before(l.ExpiresAt) || (!s.realClock() && !c.ExpiresAt.After(l.ExpiresAt)) {
		s.t.Fatalf("Checkpoint moved expiry %v -> %v, want a renewal", l.ExpiresAt, c.ExpiresAt)
	}
	cp := s.readCheckpoint(res)
	if !sameJSON(cp.State, []byte(state)) {
		s.t.Fatalf("checkpoint state %s, want %s", cp.State, state)
	}
	if cp.Token != l.Token {
		s.t.Fatalf("checkpoint token %d, want %d", cp.Token, l.Token)
	}
	if cp.UpdatedAt.Before(l.AcquiredAt) || cp.UpdatedAt.After(c.ExpiresAt) {
		s.t.Fatalf("checkpoint updated at %v, outside the lease %v..%v", cp.UpdatedAt, l.AcquiredAt, c.ExpiresAt)
	}
	if !s.realClock() && !sameMilli(cp.UpdatedAt, c.ExpiresAt.Add(-c.TTL)) {
		s.t.Fatalf("checkpoint updated at %v, want the renewal instant %v", cp.UpdatedAt, c.ExpiresAt.Add(-c.TTL))
	}
	if cp.Previous != nil {
		s.t.Fatalf("checkpoint previous %s, want nil: no lease has ended", fmtPrev(cp.Previous))
	}
	st := s.status(res)
	s.wantLeaseIs("status after checkpoint", st.Lease, c)
	if st.Checkpoint == nil || st.Checkpoint.Token != l.Token || st.Checkpoint.SizeBytes != len(state) || !sameMilli(st.Checkpoint.UpdatedAt, cp.UpdatedAt) {
		s.t.Fatalf("status checkpoint %+v, want token %d, %d bytes, updated %v", st.Checkpoint, l.Token, len(state), cp.UpdatedAt)
	}
}

func testCheckpointAnyJSONValue(s *suite) {
	const res = "cp:values"
	l := s.acquire(res, "alice", longTTL)
	for _, state := range []string{`{"a":{"b":[1,2,3]}}`, `"half done"`, `42`, `-0.5e3`, `[true,false,null]`, `false`, `{}`} {
		s.checkpoint(l, state)
		cp := s.readCheckpoint(res)
		if !sameJSON(cp.State, []byte(state)) {
			s.t.Fatalf("saved %s, read back %s", state, cp.State)
		}
		if st := s.status(res); st.Checkpoint == nil || st.Checkpoint.SizeBytes != len(state) {
			s.t.Fatalf("status checkpoint %+v after saving %d bytes", st.Checkpoint, len(state))
		}
	}
}

func testNoCheckpoint(s *suite) {
	const res = "cp:none"
	_, err := s.st.ReadCheckpoint(s.ctx, res)
	s.wantErr("ReadCheckpoint of an unknown resource", err, fencing.ErrNoCheckpoint)
	l := s.acquire(res, "alice", longTTL)
	_, err = s.st.ReadCheckpoint(s.ctx, res)
	s.wantErr("ReadCheckpoint of a leased resource without checkpoint", err, fencing.ErrNoCheckpoint)
	s.release(l, true)
	_, err = s.st.ReadCheckpoint(s.ctx, res)
	s.wantErr("ReadCheckpoint after a release without checkpoint", err, fencing.ErrNoCheckpoint)
	if st := s.status(res); st.Checkpoint != nil {
		s.t.Fatalf("status checkpoint %+v, want nil", *st.Checkpoint)
	}
}

// testPreviousReleased is the handoff check for both finished values.
func testPreviousReleased(s *suite, finished bool) {
	const res = "cp:handoff"
	a := s.acquire(res, "alice", longTTL)
	s.checkpoint(a, `{"done":7}`)
	s.release(a, finished)
	st := s.status(res)
	if st.Lease != nil {
		s.t.Fatalf("lease %+v live after release", *st.Lease)
	}
	s.wantPrevious("status after release", st.Previous, "alice", a.Token, fencing.EndReleased, finished)
	cp := s.readCheckpoint(res)
	s.wantPrevious("checkpoint after release", cp.Previous, "alice", a.Token, fencing.EndReleased, finished)
	if cp.Token != a.Token || !sameJSON(cp.State, []byte(`{"done":7}`)) {
		s.t.Fatalf("checkpoint after release %+v, want alice's state and token %d", cp, a.Token)
	}
	// The next holder reads how the previous one left.
	b := s.acquire(res, "bob", longTTL)
	s.wantPrevious("status for the next holder", s.status(res).Previous, "alice", a.Token, fencing.EndReleased, finished)
	cp = s.readCheckpoint(res)
	s.wantPrevious("checkpoint for the next holder", cp.Previous, "alice", a.Token, fencing.EndReleased, finished)
	if cp.Token != a.Token {
		s.t.Fatalf("checkpoint token %d, want alice's %d", cp.Token, a.Token)
	}
	s.checkpoint(b, `{"done":8}`)
	cp = s.readCheckpoint(res)
	if cp.Token != b.Token || !sameJSON(cp.State, []byte(`{"done":8}`)) {
		s.t.Fatalf("checkpoint %+v, want bob's state and token %d", cp, b.Token)
	}
	s.wantPrevious("checkpoint after the next holder saved", cp.Previous, "alice", a.Token, fencing.EndReleased, finished)
	// Bob ends the other way; the history moves on.
	s.release(b, !finished)
	s.wantPrevious("status after the next release", s.status(res).Previous, "bob", b.Token, fencing.EndReleased, !finished)
}

func testPreviousReleasedFinished(s *suite)   { testPreviousReleased(s, true) }
func testPreviousReleasedUnfinished(s *suite) { testPreviousReleased(s, false) }

func testPreviousExpired(s *suite) {
	const res = "cp:expired"
	a := s.acquire(res, "alice", s.shortTTL())
	s.checkpoint(a, `"partial"`)
	s.expire()
	st := s.status(res)
	if st.Lease != nil {
		s.t.Fatalf("lease %+v live after expiry", *st.Lease)
	}
	s.wantPrevious("status after expiry", st.Previous, "alice", a.Token, fencing.EndExpired, false)
	s.wantPrevious("checkpoint after expiry", s.readCheckpoint(res).Previous, "alice", a.Token, fencing.EndExpired, false)
	b := s.acquire(res, "bob", longTTL)
	cp := s.readCheckpoint(res)
	s.wantPrevious("checkpoint for the next holder", cp.Previous, "alice", a.Token, fencing.EndExpired, false)
	if cp.Token != a.Token || !sameJSON(cp.State, []byte(`"partial"`)) {
		s.t.Fatalf("checkpoint %+v, want alice's partial state", cp)
	}
	s.wantPrevious("status for the next holder", s.status(res).Previous, "alice", a.Token, fencing.EndExpired, false)
	s.release(b, true)
	s.wantPrevious("status after the next holder released", s.status(res).Previous, "bob", b.Token, fencing.EndReleased, true)
}

func testCheckpointSurvivesReopen(s *suite) {
	s.needReopen()
	const res = "cp:reopen"
	l := s.acquire(res, "alice", longTTL)
	s.checkpoint(l, `{"kept":true}`)
	before := s.readCheckpoint(res)
	s.reopen()
	cp := s.readCheckpoint(res)
	if cp.Token != l.Token || !sameJSON(cp.State, []byte(`{"kept":true}`)) || !sameMilli(cp.UpdatedAt, before.UpdatedAt) {
		s.t.Fatalf("checkpoint after reopen %+v, want %+v", cp, before)
	}
	s.checkpoint(l, `{"kept":2}`)
	if cp := s.readCheckpoint(res); !sameJSON(cp.State, []byte(`{"kept":2}`)) {
		s.t.Fatalf("checkpoint after reopen and save %s", cp.State)
	}
}
