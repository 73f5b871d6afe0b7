package fencingtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// suite is one subtest's view of one opened store.
type suite struct {
	t        *testing.T
	h        Harness
	inst     Instance
	st       fencing.Store
	ctx      context.Context
	maxState int
}

func newSuite(t *testing.T, h Harness) *suite {
	t.Helper()
	if h.Open == nil {
		t.Fatal("fencingtest: Harness.Open is nil")
	}
	inst := h.Open(t)
	if inst.Store == nil {
		t.Fatal("fencingtest: Harness.Open returned no store")
	}
	maxState := h.MaxCheckpointBytes
	if maxState == 0 {
		maxState = fencing.DefaultMaxCheckpointBytes
	}
	return &suite{t: t, h: h, inst: inst, st: inst.Store, ctx: context.Background(), maxState: maxState}
}

// realClock reports whether the store's time cannot be moved.
func (s *suite) realClock() bool { return s.inst.Advance == nil }

// shortTTL is the TTL of leases the case lets expire: 1 s with a real clock
// (the minimum, to keep sleeps short), longer with a fake one.
func (s *suite) shortTTL() time.Duration {
	if s.realClock() {
		return fencing.MinTTL
	}
	return 10 * time.Second
}

// longTTL is the TTL of leases that must stay live for the whole case, even
// on a slow machine with a real clock.
const longTTL = 60 * time.Second

// expire makes leases taken with shortTTL expire: it advances the fake clock
// past them, or sleeps past them with a real clock.
func (s *suite) expire() {
	s.t.Helper()
	if s.realClock() {
		time.Sleep(s.shortTTL() + 200*time.Millisecond)
		return
	}
	s.inst.Advance(s.shortTTL() + time.Millisecond)
}

// advance moves the fake clock by d; with a real clock it does nothing (the
// callers' checks then hold with d = 0).
func (s *suite) advance(d time.Duration) {
	if !s.realClock() {
		s.inst.Advance(d)
	}
}

// reopen closes and reopens the store, or skips the case when the store
// keeps nothing across a reopen.
func (s *suite) reopen() {
	s.t.Helper()
	if s.inst.Reopen == nil {
		s.t.Skip("store keeps nothing across a reopen")
	}
	st := s.inst.Reopen(s.t)
	if st == nil {
		s.t.Fatal("Reopen returned no store")
	}
	s.st = st
}

func (s *suite) needReopen() {
	s.t.Helper()
	if s.inst.Reopen == nil {
		s.t.Skip("store keeps nothing across a reopen")
	}
}

func (s *suite) acquire(res, owner string, ttl time.Duration) fencing.Lease {
	s.t.Helper()
	l, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: res, Owner: owner, TTL: ttl})
	if err != nil {
		s.t.Fatalf("Acquire(%q, %q, %v): %v", res, owner, ttl, err)
	}
	if l.Resource != res || l.Owner != owner || l.TTL != ttl || l.Token == 0 {
		s.t.Fatalf("Acquire(%q, %q, %v) = %+v: wrong resource, owner, TTL or zero token", res, owner, ttl, l)
	}
	if got := l.ExpiresAt.Sub(l.AcquiredAt); got < ttl {
		s.t.Fatalf("Acquire(%q, %q, %v): expires_at - acquired_at = %v, want at least the TTL", res, owner, ttl, got)
	}
	return l
}

func (s *suite) release(l fencing.Lease, finished bool) bool {
	s.t.Helper()
	ok, err := s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: l.Resource, Owner: l.Owner, Token: l.Token, Finished: finished})
	if err != nil {
		s.t.Fatalf("Release(%q, %q, %d): %v", l.Resource, l.Owner, l.Token, err)
	}
	return ok
}

func (s *suite) status(res string) fencing.Status {
	s.t.Helper()
	st, err := s.st.Status(s.ctx, res)
	if err != nil {
		s.t.Fatalf("Status(%q): %v", res, err)
	}
	if st.Resource != res {
		s.t.Fatalf("Status(%q).Resource = %q", res, st.Resource)
	}
	return st
}

func (s *suite) admit(res string, tok fencing.Token) fencing.Admission {
	s.t.Helper()
	a, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: tok})
	if err != nil {
		s.t.Fatalf("Admit(%q, %d): %v", res, tok, err)
	}
	if a.Token != tok || a.HighWater != tok || a.Issued < tok {
		s.t.Fatalf("Admit(%q, %d) = %+v: want token and high water %d, issued >= token", res, tok, a, tok)
	}
	return a
}

func (s *suite) checkpoint(l fencing.Lease, state string) fencing.Lease {
	s.t.Helper()
	got, err := s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: l.Resource, Owner: l.Owner, Token: l.Token, State: json.RawMessage(state)})
	if err != nil {
		s.t.Fatalf("Checkpoint(%q, %q, %d): %v", l.Resource, l.Owner, l.Token, err)
	}
	if got.Resource != l.Resource || got.Owner != l.Owner || got.Token != l.Token {
		s.t.Fatalf("Checkpoint returned lease %+v, want the holder's lease %+v", got, l)
	}
	return got
}

// issue makes the resource's issued token reach at least n, by acquiring and
// releasing as fresh owners. It returns the last lease taken.
func (s *suite) issue(res string, n fencing.Token) fencing.Lease {
	s.t.Helper()
	var l fencing.Lease
	for i := 0; ; i++ {
		l = s.acquire(res, fmt.Sprintf("issuer-%d", i), longTTL)
		if l.Token >= n {
			return l
		}
		if !s.release(l, false) {
			s.t.Fatalf("Release of a live lease %+v reported false", l)
		}
	}
}

// wantErr fails unless err matches target.
func (s *suite) wantErr(op string, err, target error) {
	s.t.Helper()
	if !errors.Is(err, target) {
		s.t.Fatalf("%s: error %v, want one matching %v", op, err, target)
	}
}

// wantLeaseIs fails unless got describes the same lease as want: owner,
// token, TTL and expiry (to the millisecond).
func (s *suite) wantLeaseIs(what string, got *fencing.Lease, want fencing.Lease) {
	s.t.Helper()
	if got == nil {
		s.t.Fatalf("%s: no live lease, want %+v", what, want)
	}
	if got.Resource != want.Resource || got.Owner != want.Owner || got.Token != want.Token || got.TTL != want.TTL {
		s.t.Fatalf("%s: lease %+v, want %+v", what, *got, want)
	}
	if !sameMilli(got.ExpiresAt, want.ExpiresAt) || !sameMilli(got.AcquiredAt, want.AcquiredAt) {
		s.t.Fatalf("%s: lease times %v..%v, want %v..%v", what, got.AcquiredAt, got.ExpiresAt, want.AcquiredAt, want.ExpiresAt)
	}
}

// sameMilli compares store times at the API's precision.
func sameMilli(a, b time.Time) bool {
	d := a.Sub(b)
	return d > -time.Millisecond && d < time.Millisecond
}

func (s *suite) wantPrevious(what string, got *fencing.Previous, owner string, tok fencing.Token, ended fencing.Ending, finished bool) {
	s.t.Helper()
	want := fencing.Previous{Owner: owner, Token: tok, Ended: ended, Finished: finished}
	if got == nil || *got != want {
		s.t.Fatalf("%s: previous %s, want %+v", what, fmtPrev(got), want)
	}
}

func fmtPrev(p *fencing.Previous) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprintf("%+v", *p)
}

// sameJSON compares two JSON texts ignoring insignificant whitespace.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ea, _ := json.Marshal(x)
	eb, _ := json.Marshal(y)
	return string(ea) == string(eb)
}
