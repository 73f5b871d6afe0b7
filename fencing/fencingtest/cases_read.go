package fencingtest

import (
	"errors"
	"fmt"
	"sort"

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

// listAfter is one page: the live leases under prefix after the cursor.
func (s *suite) listAfter(prefix, after string, limit int) []fencing.Lease {
	s.t.Helper()
	ls, err := s.st.List(s.ctx, fencing.ListRequest{Prefix: prefix, Limit: limit, After: after})
	if err != nil {
		s.t.Fatalf("List(%q, after %q, %d): %v", prefix, after, limit, err)
	}
	return ls
}

// pages follows the cursor (the last resource of each full page) until a
// page shorter than limit, as the lease API's next_cursor does, and returns
// every lease seen and the number of pages.
func (s *suite) pages(prefix string, limit int) ([]fencing.Lease, int) {
	s.t.Helper()
	var all []fencing.Lease
	after := ""
	for n := 1; ; n++ {
		page := s.listAfter(prefix, after, limit)
		if len(page) > limit {
			s.t.Fatalf("page %d has %d leases, over the limit %d", n, len(page), limit)
		}
		all = append(all, page...)
		if len(page) < limit {
			return all, n
		}
		after = page[len(page)-1].Resource
		if n > 10000 {
			s.t.Fatal("the pages never end")
		}
	}
}

func testListPagesEveryLeaseOnce(s *suite) {
	// 23 live leases under page:, taken out of order, among released ones
	// and near-miss names around the prefix.
	var want []fencing.Lease
	for _, i := range []int{7, 3, 22, 0, 15, 9, 1, 18, 11, 4, 20, 13, 6, 2, 17, 10, 21, 5, 14, 8, 19, 12, 16} {
		want = append(want, s.acquire(fmt.Sprintf("page:%02d", i), fmt.Sprintf("w%d", i), longTTL))
	}
	for _, i := range []int{3, 11} {
		s.release(s.acquire(fmt.Sprintf("page:%02d.gone", i), "gone", longTTL), true)
	}
	pagf := s.acquire("pagf", "near", longTTL)
	s.acquire("pag", "near", longTTL)
	s.acquire("page", "near", longTTL) // sorts before "page:"
	sort.Slice(want, func(i, j int) bool { return want[i].Resource < want[j].Resource })
	for _, limit := range []int{1, 5, 7, 23, 24, fencing.MaxListLimit} {
		got, n := s.pages("page:", limit)
		s.wantList(fmt.Sprintf("pages of %d under page:", limit), got, want...)
		if wantPages := len(want)/limit + 1; n != wantPages {
			s.t.Fatalf("pages of %d: %d pages, want %d (the last one shorter than the limit)", limit, n, wantPages)
		}
	}
	// A cursor before the prefix, past the end, and between names.
	s.wantList("List page: after a name before the prefix", s.listAfter("page:", "page", 2), want[0], want[1])
	s.wantList("List page: after the last name", s.listAfter("page:", "page:22", 5))
	s.wantList("List page: after a name past every lease", s.listAfter("page:", "zzz", 5))
	s.wantList("List page: after a name between leases", s.listAfter("page:", "page:03.gone", 2), want[4], want[5])
	s.wantList("List page: after a name that is no lease", s.listAfter("page:", "page:10a", 1), want[11])
	s.wantList("List all after page:21", s.listAfter("", "page:21", 3), want[22], pagf)
}

// Leases taken and released between pages never make a page repeat a
// resource or skip one that stayed live throughout.
func testListPagesWhileLeasesChange(s *suite) {
	var stay []fencing.Lease
	for i := range 12 {
		stay = append(stay, s.acquire(fmt.Sprintf("chg:%02d", 2*i), "stay", longTTL))
	}
	var churn []fencing.Lease
	for i := range 12 {
		churn = append(churn, s.acquire(fmt.Sprintf("chg:%02d", 2*i+1), "churn", longTTL))
	}
	seen := map[string]int{}
	after := ""
	for round := 0; ; round++ {
		page := s.listAfter("chg:", after, 4)
		for _, l := range page {
			seen[l.Resource]++
		}
		// Between pages: end a churning lease behind and ahead of the
		// cursor, and take new ones on both sides.
		if round < len(churn) {
			s.release(churn[round], false)
			s.acquire(fmt.Sprintf("chg:%02d.new", round), "new", longTTL)
			s.acquire(fmt.Sprintf("chg:%02d.new", 23-round), "new", longTTL)
		}
		if len(page) < 4 {
			break
		}
		after = page[len(page)-1].Resource
	}
	for name, n := range seen {
		if n != 1 {
			s.t.Fatalf("%s listed %d times across the pages", name, n)
		}
	}
	for _, l := range stay {
		if seen[l.Resource] != 1 {
			s.t.Fatalf("%s stayed live throughout and was not listed", l.Resource)
		}
	}
}
