package fencingtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/fencegate/fencegate/fencing"
)

// CheckBatchAdmit checks a store's fencing.BatchAdmitter against its
// Admit: every answer of a batch (admitted with a raise or at the mark,
// not issued, stale, not held, invalid, an unknown resource) is the one
// Admit gives for the same request, the raises in the batch are applied,
// and the refusals change nothing. st must batch: fencing.CapabilitiesOf
// reports a BatchAdmitter.
func CheckBatchAdmit(t *testing.T, st fencing.Store) {
	t.Helper()
	b := fencing.CapabilitiesOf(st).Batch
	if b == nil {
		t.Fatalf("%T does not batch admissions", st)
	}
	ctx := context.Background()
	acquire := func(res string) fencing.Token {
		t.Helper()
		l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "b", TTL: fencing.MaxTTL})
		if err != nil {
			t.Fatal(err)
		}
		return l.Token
	}
	release := func(res string, tok fencing.Token) {
		t.Helper()
		if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "b", Token: tok}); err != nil {
			t.Fatal(err)
		}
	}
	admit := func(req fencing.AdmitRequest) {
		t.Helper()
		if _, err := st.Admit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	// raise: a first write; mark: at the mark; stale: a token the
	// next lease's write superseded; notheld: released; live: held.
	raise := acquire("batch:raise")
	mark := acquire("batch:mark")
	admit(fencing.AdmitRequest{Resource: "batch:mark", Token: mark})
	old := acquire("batch:stale")
	release("batch:stale", old)
	admit(fencing.AdmitRequest{Resource: "batch:stale", Token: acquire("batch:stale")})
	gone := acquire("batch:notheld")
	release("batch:notheld", gone)
	live := acquire("batch:live")

	reqs := []fencing.AdmitRequest{
		{Resource: "batch:raise", Token: raise},
		{Resource: "batch:mark", Token: mark, RequireLive: true},
		{Resource: "batch:stale", Token: old},
		{Resource: "batch:mark", Token: mark + 1},
		{Resource: "batch:notheld", Token: gone, RequireLive: true},
		{Resource: "batch:live", Token: live, RequireLive: true},
		{Resource: "", Token: 1},
		{Resource: "batch:unknown", Token: 1},
		{Resource: "batch:mark", Token: mark},
	}
	out := make([]fencing.Admission, len(reqs))
	errs := make([]error, len(reqs))
	b.AdmitBatch(ctx, reqs, out, errs)
	wantOK := []bool{true, true, false, false, false, true, false, false, true}
	for i, req := range reqs {
		if (errs[i] == nil) != wantOK[i] {
			t.Fatalf("batch answer %d (%+v): %+v, %v; want admitted %v", i, req, out[i], errs[i], wantOK[i])
		}
		// Admit now answers the same: the admissions were applied, the
		// refusals changed nothing (a second admission never raises).
		a, err := st.Admit(ctx, req)
		if !sameRefusal(err, errs[i]) {
			t.Fatalf("request %d (%+v): the batch answered %v, Admit %v", i, req, errs[i], err)
		}
		got := out[i]
		got.Raised = false
		if err == nil && got != a {
			t.Fatalf("request %d (%+v): the batch admitted %+v, Admit %+v", i, req, out[i], a)
		}
	}
	if !out[0].Raised || out[0].HighWater != raise || out[1].Raised || !out[5].Raised || out[8].Raised || out[8].HighWater != mark {
		t.Fatalf("raises: %+v, %+v, %+v, %+v; want the first and the live one raised, the marks not", out[0], out[1], out[5], out[8])
	}
	for res, want := range map[string]fencing.Token{"batch:raise": raise, "batch:mark": mark, "batch:live": live, "batch:notheld": 0} {
		s, err := st.Status(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		if s.HighWater != want {
			t.Fatalf("%s: high-water mark %d after the batch, want %d", res, s.HighWater, want)
		}
	}
}

// sameRefusal reports whether two answers to one admission are the same:
// the same error text, or both stale on a resource with no record (whose
// mark is the store's clock when each was answered, so it differs).
func sameRefusal(a, b error) bool {
	var sa, sb *fencing.StaleTokenError
	if errors.As(a, &sa) && errors.As(b, &sb) && sa.BeforeLoss && sb.BeforeLoss {
		return sa.Resource == sb.Resource && sa.Token == sb.Token
	}
	return fmt.Sprint(a) == fmt.Sprint(b)
}
