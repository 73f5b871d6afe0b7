package fencingtest

import (
	"context"
	"testing"

	"github.com/fencegate/fencegate/fencing"
)

// CheckQuickAdmit checks a store's fencing.QuickAdmitter against its
// Admit: an admission at the high-water mark is answered at once, with the
// mark; one that raises the mark is answered at once only when raises
// says the store promises it (the memory store; the file store leaves a
// raise, which writes its file, to Admit), and otherwise changes nothing;
// a refusal (a token not issued, a stale token, an invalid request) is
// never answered at once and changes nothing.
func CheckQuickAdmit(t *testing.T, st fencing.Store, raises bool) {
	t.Helper()
	q := fencing.CapabilitiesOf(st).Quick
	if q == nil {
		t.Fatalf("%T does not admit at once", st)
	}
	ctx := context.Background()
	mark := func(res string) fencing.Token {
		t.Helper()
		s, err := st.Status(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		return s.HighWater
	}
	const res = "quick:admit"
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "q", TTL: fencing.MaxTTL})
	if err != nil {
		t.Fatal(err)
	}
	// A raise.
	a, ok := q.AdmitNow(fencing.AdmitRequest{Resource: res, Token: l.Token})
	switch {
	case ok != raises:
		t.Fatalf("AdmitNow of a raise answered %v, want %v", ok, raises)
	case ok && (a.HighWater != l.Token || !a.Raised || mark(res) != l.Token):
		t.Fatalf("AdmitNow of a raise: %+v, mark %d, want the mark raised to %d", a, mark(res), l.Token)
	case !ok && mark(res) != 0:
		t.Fatalf("AdmitNow left a raise to Admit but moved the mark to %d", mark(res))
	}
	if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	// At the mark.
	if a, ok := q.AdmitNow(fencing.AdmitRequest{Resource: res, Token: l.Token, RequireLive: true}); !ok || a.HighWater != l.Token || a.Raised {
		t.Fatalf("AdmitNow at the mark: %+v %v", a, ok)
	}
	// Refusals.
	if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "q", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	for _, req := range []fencing.AdmitRequest{
		{Resource: res, Token: l.Token + 1},                // not issued
		{Resource: res, Token: l.Token, RequireLive: true}, // lease not held
		{Resource: "", Token: l.Token},                     // invalid
		{Resource: res, Token: l.Token - 1},                // stale (or zero)
	} {
		if a, ok := q.AdmitNow(req); ok {
			t.Fatalf("AdmitNow(%+v) answered %+v; a refusal is left to Admit", req, a)
		}
		if m := mark(res); m != l.Token {
			t.Fatalf("AdmitNow(%+v) moved the mark to %d", req, m)
		}
	}
}
