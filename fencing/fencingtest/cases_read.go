package fencingtest

import (
	"errors"

	"github.com/fencegate/fencegate/fencing"
)

func testStatusUnknownResource(s *suite) {
	const res = "never:seen"
	st := s.status(res)
	if st.Issued != 0 || st.HighWater != 0 || st.Lease != nil || st.Previous != nil || st.Checkpoint != nil {
		s.t.Fatalf("status of an unknown resource %+v, want zeros and nils", st)
	}
	// Refused calls on it create nothing.
	s.wantUnknownRefused(res, 1)
	_, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: 1})
	s.wantErr("Renew of an unknown resource", err, fencing.ErrLeaseLost)
	_, err = s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: 1})
	s.wantErr("Release of an unknown resource", err, fencing.ErrLeaseLost)
	_, err = s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: 1, RequireLive: true})
	if !errors.Is(err, fencing.ErrTokenNotIssued) && !errors.Is(err, fencing.ErrLeaseNotHeld) && !(s.inst.ClockTokens && errors.Is(err, fencing.ErrStaleToken)) {
		s.t.Fatalf("strict Admit of an unknown resource: %v, want ErrTokenNotIssued or ErrLeaseNotHeld", err)
	}
	st = s.status(res)
	if st.Issued != 0 || st.HighWater != 0 || st.Lease != nil || st.Previous != nil || st.Checkpoint != nil {
		s.t.Fatalf("status after refused calls %+v, want zeros and nils", st)
	}
}

func (s *suite) list(prefix string, limit int) []fencing.Lease {
	s.t.Helper()
	ls, err := s.st.List(s.ctx, fencing.ListRequest{Prefix: prefix, Limit: limit})
	if err != nil {
		s.t.Fatalf("List(%q, %d): %v", prefix, limit, err)
	}
	return ls
}

func (s *suite) wantList(what string, got []fencing.Lease, want ...fencing.Lease) {
	s.t.Helper()
	if len(got) != len(want) {
		names := make([]string, len(got))
		for i, l := range got {
			names[i] = l.Resource
		}
		s.t.Fatalf("%s: %d leases %q, want %d", what, len(got), names, len(want))
	}
	for i := range want {
		s.wantLeaseIs(what, &got[i], want[i])
	}
}

func testListPrefixLimitOrder(s *suite) {
	// Taken out of order; a released lease and a near-miss prefix.
	c := s.acquire("job:c", "w3", longTTL)
	a := s.acquire("job:a", "w1", longTTL)
	d := s.acquire("job:d", "w4", longTTL)
	s.release(d, true)
	b := s.acquire("job:b", "w2", 2*longTTL)
	jobs := s.acquire("jobs", "w5", longTTL)
	x := s.acquire("task:x", "w6", longTTL)
	s.wantList("List job:", s.list("job:", 0), a, b, c)
	s.wantList("List job: limit 2", s.list("job:", 2), a, b)
	s.wantList("List job: limit 1", s.list("job:", 1), a)
	s.wantList("List job", s.list("job", 0), a, b, c, jobs)
	s.wantList("List all", s.list("", 0), a, b, c, jobs, x)
	s.wantList("List all limit 4", s.list("", 4), a, b, c, jobs)
	s.wantList("List job:a", s.list("job:a", 0), a)
	s.wantList("List nothing", s.list("nothing:", 0))
	s.wantList("List past the end", s.list("zzz", 0))
}

func testListOmitsExpired(s *suite) {
	s.acquire("exp:a", "w1", s.shortTTL())
	b := s.acquire("exp:b", "w2", longTTL)
	s.acquire("exp:c", "w3", s.shortTTL())
	s.expire()
	s.wantList("List after expiry", s.list("exp:", 0), b)
	s.wantList("List limit 1 after expiry", s.list("exp:", 1), b)
	if !s.realClock() {
		s.inst.Advance(longTTL)
		s.wantList("List after every lease expired", s.list("", 0))
	}
}
