package fencingtest

import (
	"errors"

	"github.com/fencegate/fencegate/fencing"
)

// wantNotIssued fails unless admitting tok is refused as never issued,
// reporting issued.
func (s *suite) wantNotIssued(res string, tok, issued fencing.Token) {
	s.t.Helper()
	_, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: tok})
	var e *fencing.TokenNotIssuedError
	if !errors.As(err, &e) || !errors.Is(err, fencing.ErrTokenNotIssued) {
		s.t.Fatalf("Admit(%q, %d): error %v, want *fencing.TokenNotIssuedError", res, tok, err)
	}
	if e.Issued != issued || e.Token != tok || e.Resource != res {
		s.t.Fatalf("Admit(%q, %d): %+v, want issued %d", res, tok, *e, issued)
	}
}

// wantUnknownRefused fails unless admitting tok on a resource the store
// holds no record of is refused: as stale when the store's tokens follow
// its clock and tok is below it (every such token was issued before the
// record went), as not issued otherwise. Nothing may be admitted.
func (s *suite) wantUnknownRefused(res string, tok fencing.Token) {
	s.t.Helper()
	if !s.inst.ClockTokens {
		s.wantNotIssued(res, tok, 0)
		return
	}
	_, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: tok})
	var e *fencing.StaleTokenError
	if !errors.As(err, &e) || e.Token != tok || e.Resource != res || e.HighWater <= tok {
		s.t.Fatalf("Admit(%q, %d) on a resource with no record: %v, want *fencing.StaleTokenError with a mark above the token", res, tok, err)
	}
}

// wantStale fails unless admitting tok is refused as stale, reporting
// highWater.
func (s *suite) wantStale(res string, tok, highWater fencing.Token) {
	s.t.Helper()
	_, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: tok})
	var e *fencing.StaleTokenError
	if !errors.As(err, &e) || !errors.Is(err, fencing.ErrStaleToken) {
		s.t.Fatalf("Admit(%q, %d): error %v, want *fencing.StaleTokenError", res, tok, err)
	}
	if e.HighWater != highWater || e.Token != tok || e.Resource != res {
		s.t.Fatalf("Admit(%q, %d): %+v, want high water %d", res, tok, *e, highWater)
	}
}

func (s *suite) wantMarks(res string, issued, highWater fencing.Token) fencing.Status {
	s.t.Helper()
	st := s.status(res)
	if st.Issued != issued || st.HighWater != highWater {
		s.t.Fatalf("status of %q: issued %d, high water %d; want %d, %d", res, st.Issued, st.HighWater, issued, highWater)
	}
	return st
}

func testAdmitTokenNotIssued(s *suite) {
	const res = "admit:notissued"
	s.wantUnknownRefused(res, 1)
	s.wantMarks(res, 0, 0)
	l := s.acquire(res, "alice", longTTL)
	s.wantNotIssued(res, l.Token+1, l.Token)
	s.wantMarks(res, l.Token, 0)
	a := s.admit(res, l.Token)
	if !a.Raised || a.Issued != l.Token {
		s.t.Fatalf("first admission %+v, want Raised and issued %d", a, l.Token)
	}
	s.wantMarks(res, l.Token, l.Token)
}

func testAdmitStaleToken(s *suite) {
	const res = "admit:stale"
	a := s.acquire(res, "alice", longTTL)
	s.admit(res, a.Token)
	s.release(a, false)
	b := s.acquire(res, "bob", longTTL)
	// The old holder may still write until the new one does.
	s.admit(res, a.Token)
	adm := s.admit(res, b.Token)
	if !adm.Raised {
		s.t.Fatalf("admission of the newer token %+v did not raise the mark", adm)
	}
	s.wantStale(res, a.Token, b.Token)
	s.wantMarks(res, b.Token, b.Token)
}

func testAdmitEqualTokenRepeatedly(s *suite) {
	const res = "admit:equal"
	l := s.acquire(res, "alice", longTTL)
	for i := range 10 {
		a := s.admit(res, l.Token)
		if a.Raised != (i == 0) {
			s.t.Fatalf("admission %d at token %d: Raised %v, want %v", i, l.Token, a.Raised, i == 0)
		}
		if a.Issued != l.Token || a.Resource != res {
			s.t.Fatalf("admission %d = %+v, want resource %q issued %d", i, a, res, l.Token)
		}
	}
	s.wantMarks(res, l.Token, l.Token)
	s.wantLeaseIs("lease after admissions", s.status(res).Lease, l)
}

func testHighWaterSurvivesReleaseAndExpiry(s *suite) {
	const res = "admit:survives"
	a := s.acquire(res, "alice", longTTL)
	s.admit(res, a.Token)
	s.release(a, true)
	s.wantMarks(res, a.Token, a.Token)
	b := s.acquire(res, "bob", s.shortTTL())
	s.admit(res, b.Token)
	s.expire()
	s.wantMarks(res, b.Token, b.Token)
	s.wantStale(res, a.Token, b.Token)
	if adm := s.admit(res, b.Token); adm.Raised {
		s.t.Fatalf("admission at the mark after expiry %+v reported Raised", adm)
	}
}

func testHighWaterSurvivesReopen(s *suite) {
	s.needReopen()
	const res = "admit:reopen"
	b := s.issue(res, 2)
	s.admit(res, b.Token)
	s.reopen()
	s.wantMarks(res, b.Token, b.Token)
	s.wantStale(res, b.Token-1, b.Token)
	if adm := s.admit(res, b.Token); adm.Raised {
		s.t.Fatalf("admission at the mark after reopen %+v reported Raised", adm)
	}
	s.wantNotIssued(res, b.Token+1, b.Token)
}

func testForgedHugeTokenRefused(s *suite) {
	const res = "admit:forged"
	l := s.acquire(res, "alice", longTTL)
	s.admit(res, l.Token)
	for _, tok := range []fencing.Token{l.Token + 1, l.Token + 1000, 1 << 53, 1<<53 + 1, 1<<63 + 5, 1<<64 - 1} {
		s.wantNotIssued(res, tok, l.Token)
	}
	s.wantMarks(res, l.Token, l.Token)
	if a := s.admit(res, l.Token); a.Raised {
		s.t.Fatalf("holder's admission after forged tokens %+v reported Raised", a)
	}
	s.wantLeaseIs("holder's lease after forged tokens", s.status(res).Lease, l)
}

func testAdmitRequireLive(s *suite) {
	const res = "admit:live"
	a := s.acquire(res, "alice", longTTL)
	s.release(a, false)
	b := s.acquire(res, "bob", longTTL)
	// a.Token is within [high water, issued] but names no live lease.
	_, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: a.Token, RequireLive: true})
	s.wantErr("strict Admit of an ended lease's token", err, fencing.ErrLeaseNotHeld)
	s.wantMarks(res, b.Token, 0)
	adm, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: b.Token, RequireLive: true})
	if err != nil || !adm.Raised || adm.HighWater != b.Token {
		s.t.Fatalf("strict Admit of the live token = %+v, %v; want raised to %d", adm, err, b.Token)
	}
	s.release(b, false)
	_, err = s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: b.Token, RequireLive: true})
	s.wantErr("strict Admit after release", err, fencing.ErrLeaseNotHeld)
	// Without the strict rule the released holder's token still passes.
	s.admit(res, b.Token)
	s.wantMarks(res, b.Token, b.Token)
}

func testAdmitRequireLiveAfterExpiry(s *suite) {
	const res = "admit:live:expiry"
	l := s.acquire(res, "alice", s.shortTTL())
	if _, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: l.Token, RequireLive: true}); err != nil {
		s.t.Fatalf("strict Admit of a live lease's token: %v", err)
	}
	s.expire()
	_, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: l.Token, RequireLive: true})
	s.wantErr("strict Admit after expiry", err, fencing.ErrLeaseNotHeld)
	s.admit(res, l.Token)
}
