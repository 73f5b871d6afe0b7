package fencingtest

import (
	"errors"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

func testTokenMonotonicAcrossRelease(s *suite) {
	const res = "mono:release"
	a := s.acquire(res, "alice", longTTL)
	if !s.release(a, false) {
		s.t.Fatal("release of a live lease reported false")
	}
	b := s.acquire(res, "bob", longTTL)
	if b.Token <= a.Token {
		s.t.Fatalf("token after release %d, want > %d", b.Token, a.Token)
	}
	if !s.release(b, true) {
		s.t.Fatal("release of a live lease reported false")
	}
	// The first owner coming back is a new acquisition, not its old lease.
	a2 := s.acquire(res, "alice", longTTL)
	if a2.Token <= b.Token {
		s.t.Fatalf("token of returning owner %d, want > %d", a2.Token, b.Token)
	}
	// The same owner again, with nobody in between: a released lease is
	// never revived either.
	if !s.release(a2, false) {
		s.t.Fatal("release of a live lease reported false")
	}
	a3 := s.acquire(res, "alice", longTTL)
	if a3.Token <= a2.Token {
		s.t.Fatalf("same owner's token after its own release %d, want > %d", a3.Token, a2.Token)
	}
	// Its old token names an ended lease with a newer one issued: lost.
	_, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: a2.Token})
	s.wantErr("Renew with the same owner's older token", err, fencing.ErrLeaseLost)
	_, err = s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: "alice", Token: a2.Token, State: []byte(`1`)})
	s.wantErr("Checkpoint with the same owner's older token", err, fencing.ErrLeaseLost)
	ok, err := s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: a2.Token})
	s.wantErr("Release with the same owner's older token", err, fencing.ErrLeaseLost)
	if ok {
		s.t.Fatal("Release with the same owner's older token reported released")
	}
	st := s.status(res)
	s.wantLeaseIs("lease after calls with an older token", st.Lease, a3)
	if st.Issued != a3.Token {
		s.t.Fatalf("issued %d, want the newest token %d", st.Issued, a3.Token)
	}
}

func testTokenMonotonicAcrossExpiry(s *suite) {
	const other, same = "mono:expiry:other", "mono:expiry:same"
	o1 := s.acquire(other, "alice", s.shortTTL())
	m1 := s.acquire(same, "alice", s.shortTTL())
	s.expire()
	o2 := s.acquire(other, "bob", longTTL)
	if o2.Token <= o1.Token {
		s.t.Fatalf("token after expiry %d, want > %d", o2.Token, o1.Token)
	}
	// The same owner re-acquiring after expiry gets a new token: an
	// expired lease is never revived.
	m2 := s.acquire(same, "alice", longTTL)
	if m2.Token <= m1.Token {
		s.t.Fatalf("same owner's token after expiry %d, want > %d", m2.Token, m1.Token)
	}
}

func testTokenMonotonicAcrossReopen(s *suite) {
	s.needReopen()
	const live, ended = "mono:reopen:live", "mono:reopen:ended"
	l := s.acquire(live, "alice", longTTL)
	e := s.acquire(ended, "alice", longTTL)
	s.release(e, false)
	s.reopen()
	st := s.status(live)
	s.wantLeaseIs("live lease after reopen", st.Lease, l)
	if st.Issued != l.Token {
		s.t.Fatalf("issued after reopen %d, want %d", st.Issued, l.Token)
	}
	_, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: live, Owner: "bob", TTL: longTTL})
	s.wantErr("Acquire of a lease live across reopen", err, fencing.ErrLeaseHeld)
	e2 := s.acquire(ended, "bob", longTTL)
	if e2.Token <= e.Token {
		s.t.Fatalf("token after reopen %d, want > %d", e2.Token, e.Token)
	}
	s.release(e2, false)
	s.reopen()
	e3 := s.acquire(ended, "carol", longTTL)
	if e3.Token <= e2.Token {
		s.t.Fatalf("token after second reopen %d, want > %d", e3.Token, e2.Token)
	}
}

func testSameOwnerReacquireExtends(s *suite) {
	const res = "same:owner"
	l1 := s.acquire(res, "alice", 30*time.Second)
	s.advance(10 * time.Second)
	l2 := s.acquire(res, "alice", 40*time.Second)
	if l2.Token != l1.Token {
		s.t.Fatalf("same-owner re-acquire changed the token %d -> %d", l1.Token, l2.Token)
	}
	if !l2.ExpiresAt.After(l1.ExpiresAt) {
		s.t.Fatalf("same-owner re-acquire did not extend: expires %v, before %v", l2.ExpiresAt, l1.ExpiresAt)
	}
	st := s.status(res)
	if st.Issued != l1.Token {
		s.t.Fatalf("issued %d after same-owner re-acquire, want %d", st.Issued, l1.Token)
	}
	if st.Lease == nil || st.Lease.Token != l1.Token || st.Lease.TTL != 40*time.Second || !sameMilli(st.Lease.ExpiresAt, l2.ExpiresAt) {
		s.t.Fatalf("status lease %+v, want the extended lease %+v", st.Lease, l2)
	}
	if st.Previous != nil {
		s.t.Fatalf("status previous %s, want nil: no lease has ended", fmtPrev(st.Previous))
	}
}

func testOtherOwnerGetsLeaseHeld(s *suite) {
	const res = "held:other"
	l := s.acquire(res, "alice", longTTL)
	s.advance(time.Second)
	_, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: res, Owner: "bob", TTL: longTTL})
	var held *fencing.LeaseHeldError
	if !errors.As(err, &held) {
		s.t.Fatalf("Acquire by another owner: error %v, want *fencing.LeaseHeldError", err)
	}
	if !errors.Is(err, fencing.ErrLeaseHeld) {
		s.t.Fatalf("Acquire by another owner: %v does not match ErrLeaseHeld", err)
	}
	if held.Resource != res || held.Holder != "alice" || !sameMilli(held.ExpiresAt, l.ExpiresAt) {
		s.t.Fatalf("LeaseHeldError %+v, want resource %q holder alice expiring %v", *held, res, l.ExpiresAt)
	}
	// What is left is counted on the store's clock (Remaining): at most
	// the TTL and, a second into a long lease, still positive.
	if left := held.Remaining(); left <= 0 || left > longTTL {
		s.t.Fatalf("LeaseHeldError.Remaining() = %v, want within (0, %v]", left, longTTL)
	}
	st := s.status(res)
	s.wantLeaseIs("holder's lease after a refused acquire", st.Lease, l)
	if st.Issued != l.Token {
		s.t.Fatalf("issued %d after a refused acquire, want %d", st.Issued, l.Token)
	}
}

func testForgedOwnerOrTokenRefused(s *suite) {
	const res = "forged:lease"
	l := s.acquire(res, "alice", longTTL)
	s.advance(time.Second) // a wrongful renewal would now move the expiry
	forged := []struct {
		name  string
		owner string
		token fencing.Token
	}{
		{"other owner", "mallory", l.Token},
		{"newer token", "alice", l.Token + 1},
		{"huge token", "alice", 1<<64 - 1},
		{"other owner and token", "mallory", l.Token + 7},
	}
	state := []byte(`{"forged":true}`)
	for _, f := range forged {
		_, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: f.owner, Token: f.token})
		s.wantErr("Renew with "+f.name, err, fencing.ErrLeaseLost)
		_, err = s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: f.owner, Token: f.token, TTL: 2 * longTTL})
		s.wantErr("Renew with a TTL and "+f.name, err, fencing.ErrLeaseLost)
		ok, err := s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: f.owner, Token: f.token, Finished: true})
		s.wantErr("Release with "+f.name, err, fencing.ErrLeaseLost)
		if ok {
			s.t.Fatalf("Release with %s reported released", f.name)
		}
		_, err = s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: f.owner, Token: f.token, State: state})
		s.wantErr("Checkpoint with "+f.name, err, fencing.ErrLeaseLost)
	}
	st := s.status(res)
	s.wantLeaseIs("holder's lease after forged calls", st.Lease, l)
	if st.Issued != l.Token || st.HighWater != 0 || st.Previous != nil || st.Checkpoint != nil {
		s.t.Fatalf("status after forged calls %+v, want issued %d and nothing else", st, l.Token)
	}
	_, err := s.st.ReadCheckpoint(s.ctx, res)
	s.wantErr("ReadCheckpoint after forged checkpoints", err, fencing.ErrNoCheckpoint)
	// The real holder is unaffected.
	r, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: l.Token})
	if err != nil {
		s.t.Fatalf("holder's Renew after forged calls: %v", err)
	}
	if r.Token != l.Token {
		s.t.Fatalf("holder's Renew changed the token %d -> %d", l.Token, r.Token)
	}
}

func testRenewExtends(s *suite) {
	const res = "renew:extends"
	l := s.acquire(res, "alice", 30*time.Second)
	s.advance(5 * time.Second)
	r1, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: l.Token})
	if err != nil {
		s.t.Fatalf("Renew: %v", err)
	}
	if r1.Token != l.Token || r1.Owner != "alice" || r1.Resource != res || r1.TTL != 30*time.Second {
		s.t.Fatalf("Renew without TTL = %+v, want the same lease with its TTL 30s", r1)
	}
	if r1.ExpiresAt.Before(l.ExpiresAt) || (!s.realClock() && !r1.ExpiresAt.After(l.ExpiresAt)) {
		s.t.Fatalf("Renew moved expiry %v -> %v, want later", l.ExpiresAt, r1.ExpiresAt)
	}
	r2, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: l.Token, TTL: 45 * time.Second})
	if err != nil {
		s.t.Fatalf("Renew with TTL: %v", err)
	}
	if r2.TTL != 45*time.Second || !r2.ExpiresAt.After(r1.ExpiresAt) {
		s.t.Fatalf("Renew with TTL 45s = %+v, want TTL 45s expiring after %v", r2, r1.ExpiresAt)
	}
	s.wantLeaseIs("status after Renew", s.status(res).Lease, r2)
}

func testReleaseTwice(s *suite) {
	const res = "release:twice"
	l := s.acquire(res, "alice", longTTL)
	if !s.release(l, false) {
		s.t.Fatal("first Release reported false")
	}
	if s.release(l, false) {
		s.t.Fatal("second Release reported true, want false: the lease had already ended")
	}
	// A late release changes nothing, finished flag included.
	if s.release(l, true) {
		s.t.Fatal("third Release reported true, want false: the lease had already ended")
	}
	// Another owner naming the ended lease is lost, not "already ended".
	ok, err := s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "bob", Token: l.Token})
	s.wantErr("Release of an ended lease by another owner", err, fencing.ErrLeaseLost)
	if ok {
		s.t.Fatal("Release of an ended lease by another owner reported released")
	}
	st := s.status(res)
	if st.Lease != nil || st.Issued != l.Token {
		s.t.Fatalf("status after release %+v, want no lease and issued %d", st, l.Token)
	}
	s.wantPrevious("status after release", st.Previous, "alice", l.Token, fencing.EndReleased, false)
	// The ended lease cannot be renewed or checkpointed.
	_, err = s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: l.Token})
	s.wantErr("Renew after release", err, fencing.ErrLeaseLost)
	_, err = s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: "alice", Token: l.Token, State: []byte(`1`)})
	s.wantErr("Checkpoint after release", err, fencing.ErrLeaseLost)
}

func testReleaseByOtherOrOlderToken(s *suite) {
	const res = "release:other"
	a := s.acquire(res, "alice", longTTL)
	ok, err := s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "bob", Token: a.Token})
	s.wantErr("Release by another owner", err, fencing.ErrLeaseLost)
	if ok {
		s.t.Fatal("Release by another owner reported released")
	}
	s.wantLeaseIs("lease after another owner's release", s.status(res).Lease, a)
	s.release(a, false)
	b := s.acquire(res, "bob", longTTL)
	ok, err = s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: a.Token})
	s.wantErr("Release with an older token after a newer one was issued", err, fencing.ErrLeaseLost)
	if ok {
		s.t.Fatal("Release with an older token reported released")
	}
	_, err = s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: b.Token})
	s.wantErr("Release of the new lease by the old owner", err, fencing.ErrLeaseLost)
	s.wantLeaseIs("new lease after refused releases", s.status(res).Lease, b)
}

func testRenewAfterExpiryLost(s *suite) {
	const res = "renew:expired"
	l := s.acquire(res, "alice", s.shortTTL())
	s.expire()
	_, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: l.Token})
	s.wantErr("Renew after expiry", err, fencing.ErrLeaseLost)
	_, err = s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: l.Token, TTL: longTTL})
	s.wantErr("Renew with TTL after expiry", err, fencing.ErrLeaseLost)
	_, err = s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: "alice", Token: l.Token, State: []byte(`{}`)})
	s.wantErr("Checkpoint after expiry", err, fencing.ErrLeaseLost)
	st := s.status(res)
	if st.Lease != nil {
		s.t.Fatalf("expired lease revived: %+v", *st.Lease)
	}
	s.wantPrevious("status after expiry", st.Previous, "alice", l.Token, fencing.EndExpired, false)
	// Releasing a lease that already ended, with nothing newer issued,
	// answers false and changes nothing.
	ok, err := s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: l.Token})
	if err != nil || ok {
		s.t.Fatalf("Release after expiry = %v, %v; want false, nil", ok, err)
	}
	s.wantPrevious("status after releasing an expired lease", s.status(res).Previous, "alice", l.Token, fencing.EndExpired, false)
	l2 := s.acquire(res, "alice", longTTL)
	if l2.Token <= l.Token {
		s.t.Fatalf("re-acquire after expiry got token %d, want > %d", l2.Token, l.Token)
	}
	// The re-acquisition is a new lease: the old one is history.
	s.wantPrevious("status after the same owner re-acquired", s.status(res).Previous, "alice", l.Token, fencing.EndExpired, false)
}

func testExpiryFollowsClock(s *suite) {
	const res = "expiry:clock"
	l := s.acquire(res, "alice", s.shortTTL())
	if s.realClock() {
		if st := s.status(res); st.Lease == nil {
			s.t.Fatal("lease not live right after Acquire")
		}
	} else {
		// Live until the instant of expiry, not a moment after.
		s.inst.Advance(s.shortTTL() - time.Millisecond)
		s.wantLeaseIs("lease 1 ms before expiry", s.status(res).Lease, l)
		if _, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: res, Owner: "bob", TTL: longTTL}); !errors.Is(err, fencing.ErrLeaseHeld) {
			s.t.Fatalf("Acquire 1 ms before expiry: %v, want ErrLeaseHeld", err)
		}
		// At expires_at the lease has ended.
		s.inst.Advance(time.Millisecond)
		if st := s.status(res); st.Lease != nil {
			s.t.Fatalf("lease still live at its expires_at: %+v", *st.Lease)
		}
	}
	s.expire()
	if st := s.status(res); st.Lease != nil {
		s.t.Fatalf("lease still live after its expiry: %+v", *st.Lease)
	}
	if ls, err := s.st.List(s.ctx, fencing.ListRequest{Prefix: "expiry:"}); err != nil || len(ls) != 0 {
		s.t.Fatalf("List after expiry = %v, %v; want no leases", ls, err)
	}
	b := s.acquire(res, "bob", longTTL)
	if b.Token <= l.Token {
		s.t.Fatalf("token after expiry %d, want > %d", b.Token, l.Token)
	}
	if !b.AcquiredAt.After(l.AcquiredAt) {
		s.t.Fatalf("new lease acquired at %v, not after the expired one's %v", b.AcquiredAt, l.AcquiredAt)
	}
}
