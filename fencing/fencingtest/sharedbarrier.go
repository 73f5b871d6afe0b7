package fencingtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// BarrierHarness opens gates over one shared store for RunSharedBarrier.
type BarrierHarness struct {
	// Open returns n stores over one fresh shared namespace, as n gates
	// would open it, each implementing fencing.SharedBarrier, with their
	// cleanup registered with t (the suite may Close them itself).
	Open func(t testing.TB, n int) BarrierInstance
	// NotifyOnly turns the store's periodic re-check of waiting writes off
	// (or makes it longer than any case) until restore is called, so that
	// only a notification of a Leave can wake a wait. The suite does not
	// run its cases in parallel.
	NotifyOnly func() (restore func())
	// DropsExpired reports that the store may remove expired entries by
	// itself, uncounted (Valkey expires a resource's entries with the key
	// that holds them, at the latest deadline). When false, a registration
	// must remove and count every expired lower entry.
	DropsExpired bool
}

// BarrierInstance is one shared namespace and the views of the store's own
// storage the suite checks the contract against.
type BarrierInstance struct {
	// Gates are the stores, one per gate.
	Gates []fencing.Store
	// Entries counts the entries registered for res, read from the
	// store's storage (not through SharedBarrier), expired ones included.
	Entries func(t testing.TB, res string) int
	// Deadline is entry e's deadline as the store keeps it.
	Deadline func(t testing.TB, e fencing.BarrierEntry) time.Time
	// Now reads the store's clock, by which deadlines are judged.
	Now func(t testing.TB) time.Time
}

// RunSharedBarrier runs the contract of fencing.SharedBarrier (DESIGN §9)
// against the stores h opens, one subtest per property: lower entries are
// seen across gates and equal tokens never wait; a refused admission
// registers nothing; a Leave wakes the waiting write through a
// notification, and only the last lower entry's does; a crashed gate's
// entry blocks until its deadline by the store's clock, then expires and
// is counted; a registration is not held back by expired lower entries,
// which are gone from the store afterwards; a wait
// whose store closes fails closed.
func RunSharedBarrier(t *testing.T, h BarrierHarness) {
	t.Helper()
	if h.Open == nil || h.NotifyOnly == nil {
		t.Fatal("fencingtest: BarrierHarness.Open and NotifyOnly are required")
	}
	for _, c := range barrierCases {
		t.Run(c.name, func(t *testing.T) {
			b := newBarrierSuite(t, h)
			c.fn(b)
		})
	}
}

var barrierCases = []struct {
	name string
	fn   func(b *barrierSuite)
}{
	{"LowerSeenAcrossGates", testBarrierLowerAcrossGates},
	{"RefusalRegistersNothing", testBarrierRefusalRegistersNothing},
	{"LeaveWakesWaiter", testBarrierLeaveWakesWaiter},
	{"DeadGateEntryExpires", testBarrierDeadGateEntryExpires},
	{"RegistrationRemovesExpired", testBarrierRegistrationRemovesExpired},
	{"ClosedStoreFailsWaitClosed", testBarrierClosedStoreFailsClosed},
}

// barrierSuite is one subtest's two gates over one namespace.
type barrierSuite struct {
	t      *testing.T
	h      BarrierHarness
	inst   BarrierInstance
	g1, g2 fencing.Store
	b1, b2 fencing.SharedBarrier
	ctx    context.Context
}

func newBarrierSuite(t *testing.T, h BarrierHarness) *barrierSuite {
	t.Helper()
	inst := h.Open(t, 2)
	if len(inst.Gates) != 2 || inst.Entries == nil || inst.Deadline == nil || inst.Now == nil {
		t.Fatal("fencingtest: BarrierHarness.Open must return 2 gates, Entries, Deadline and Now")
	}
	b := &barrierSuite{t: t, h: h, inst: inst, g1: inst.Gates[0], g2: inst.Gates[1], ctx: context.Background()}
	b.b1, b.b2 = fencing.CapabilitiesOf(b.g1).Shared, fencing.CapabilitiesOf(b.g2).Shared
	if b.b1 == nil || b.b2 == nil {
		t.Fatal("fencingtest: the stores have no shared barrier")
	}
	return b
}

// holder hands res to a new owner (releasing the live lease, if any) and
// returns its token.
func (b *barrierSuite) holder(res, owner string) fencing.Token {
	b.t.Helper()
	st, err := b.g1.Status(b.ctx, res)
	if err != nil {
		b.t.Fatal(err)
	}
	if st.Lease != nil {
		if _, err := b.g1.Release(b.ctx, fencing.ReleaseRequest{Resource: res, Owner: st.Lease.Owner, Token: st.Lease.Token}); err != nil {
			b.t.Fatal(err)
		}
	}
	l, err := b.g1.Acquire(b.ctx, fencing.AcquireRequest{Resource: res, Owner: owner, TTL: longTTL})
	if err != nil {
		b.t.Fatal(err)
	}
	return l.Token
}

// register admits and registers a write through gate g (named gate).
func (b *barrierSuite) register(g fencing.SharedBarrier, gate, res string, tok fencing.Token, hold time.Duration) (fencing.BarrierEntry, bool) {
	b.t.Helper()
	adm, e, lower, err := g.AdmitRegister(b.ctx, fencing.AdmitRequest{Resource: res, Token: tok}, gate, hold)
	if err != nil {
		b.t.Fatalf("AdmitRegister(%s, %d) through %s: %v", res, tok, gate, err)
	}
	if adm.Token != tok || adm.HighWater < tok || e.Resource != res || e.Token != tok {
		b.t.Fatalf("AdmitRegister(%s, %d): admission %+v, entry %+v", res, tok, adm, e)
	}
	if !strings.Contains(e.ID, gate+":") {
		b.t.Fatalf("entry id %q does not name gate %s", e.ID, gate)
	}
	return e, lower
}

func (b *barrierSuite) leave(g fencing.SharedBarrier, e fencing.BarrierEntry) {
	b.t.Helper()
	if err := g.Leave(b.ctx, e); err != nil {
		b.t.Fatalf("Leave(%+v): %v", e, err)
	}
}

func (b *barrierSuite) wantEntries(res string, want int) {
	b.t.Helper()
	if n := b.inst.Entries(b.t, res); n != want {
		b.t.Fatalf("%d entries registered for %s, want %d", n, res, want)
	}
}

func testBarrierLowerAcrossGates(b *barrierSuite) {
	const res = "bar:lower"
	a := b.holder(res, "a")
	ea, lower := b.register(b.b1, "g1", res, a, longTTL)
	if lower {
		b.t.Fatal("the first write reports a lower entry")
	}
	ea2, lower := b.register(b.b2, "g2", res, a, longTTL)
	if lower {
		b.t.Fatal("an equal token waits for an equal one")
	}
	c := b.holder(res, "c")
	ec, lower := b.register(b.b2, "g2", res, c, longTTL)
	if !lower {
		b.t.Fatal("a higher token does not see the lower entries in flight through the other gate")
	}
	b.wantEntries(res, 3)
	for _, e := range []fencing.BarrierEntry{ea, ea2, ec} {
		b.leave(b.b1, e)
	}
	b.wantEntries(res, 0)
}

func testBarrierRefusalRegistersNothing(b *barrierSuite) {
	const res = "bar:refused"
	a := b.holder(res, "a")
	c := b.holder(res, "c")
	ec, _ := b.register(b.b1, "g1", res, c, longTTL)
	b.wantEntries(res, 1)
	if _, _, _, err := b.b2.AdmitRegister(b.ctx, fencing.AdmitRequest{Resource: res, Token: a}, "g2", longTTL); !errors.Is(err, fencing.ErrStaleToken) {
		b.t.Fatalf("AdmitRegister of a superseded token: %v, want ErrStaleToken", err)
	}
	if _, _, _, err := b.b2.AdmitRegister(b.ctx, fencing.AdmitRequest{Resource: res, Token: c + 1000}, "g2", longTTL); !errors.Is(err, fencing.ErrTokenNotIssued) {
		b.t.Fatalf("AdmitRegister of a token never issued: %v, want ErrTokenNotIssued", err)
	}
	if _, _, _, err := b.b2.AdmitRegister(b.ctx, fencing.AdmitRequest{Resource: res, Token: c, RequireLive: true}, "g2", longTTL); err != nil {
		b.t.Fatalf("AdmitRegister requiring the live lease, by its holder: %v", err)
	}
	if _, err := b.g1.Release(b.ctx, fencing.ReleaseRequest{Resource: res, Owner: "c", Token: c}); err != nil {
		b.t.Fatal(err)
	}
	if _, _, _, err := b.b2.AdmitRegister(b.ctx, fencing.AdmitRequest{Resource: res, Token: c, RequireLive: true}, "g2", longTTL); !errors.Is(err, fencing.ErrLeaseNotHeld) {
		b.t.Fatalf("AdmitRegister requiring a released lease: %v, want ErrLeaseNotHeld", err)
	}
	const unknown = "bar:never-acquired"
	// Refused either way: not issued, or stale where a missing record
	// refuses tokens below the store's clock (DESIGN §12).
	if _, _, _, err := b.b2.AdmitRegister(b.ctx, fencing.AdmitRequest{Resource: unknown, Token: 1}, "g2", longTTL); !errors.Is(err, fencing.ErrTokenNotIssued) && !errors.Is(err, fencing.ErrStaleToken) {
		b.t.Fatalf("AdmitRegister on an unknown resource: %v, want ErrTokenNotIssued or ErrStaleToken", err)
	}
	b.wantEntries(res, 2) // ec and the holder's second write
	b.wantEntries(unknown, 0)
	b.leave(b.b1, ec)
}

func testBarrierLeaveWakesWaiter(b *barrierSuite) {
	const res = "bar:wake"
	restore := b.h.NotifyOnly()
	defer restore()
	a := b.holder(res, "a")
	ea, _ := b.register(b.b1, "g1", res, a, longTTL)
	ea2, _ := b.register(b.b2, "g2", res, a, longTTL)
	c := b.holder(res, "c")
	ec, lower := b.register(b.b2, "g2", res, c, longTTL)
	if !lower {
		b.t.Fatal("no lower entry seen")
	}
	short, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	_, err := b.b2.WaitLower(short, ec)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		b.t.Fatalf("WaitLower behind two lower entries: %v, want it to block until its context ends", err)
	}
	done := make(chan error, 1)
	go func() { _, err := b.b2.WaitLower(b.ctx, ec); done <- err }()
	b.leave(b.b1, ea)
	select {
	case err := <-done:
		b.t.Fatalf("WaitLower returned (%v) while a lower entry of the other gate remains", err)
	case <-time.After(300 * time.Millisecond):
	}
	b.leave(b.b1, ea2) // a gate may remove another gate's entry
	select {
	case err := <-done:
		if err != nil {
			b.t.Fatalf("WaitLower after every lower entry left: %v", err)
		}
	case <-time.After(30 * time.Second):
		b.t.Fatal("WaitLower was not woken by the Leave of the last lower entry")
	}
	b.leave(b.b2, ec)
	b.leave(b.b2, ec) // twice: harmless
	b.wantEntries(res, 0)
	// With nothing lower, WaitLower returns at once.
	ed, lower := b.register(b.b1, "g1", res, c, longTTL)
	if lower {
		b.t.Fatal("a lower entry after every entry left")
	}
	if n, err := b.b1.WaitLower(b.ctx, ed); err != nil || n != 0 {
		b.t.Fatalf("WaitLower with nothing lower: %d, %v", n, err)
	}
	b.leave(b.b1, ed)
}

func testBarrierDeadGateEntryExpires(b *barrierSuite) {
	const res = "bar:dead"
	c := b.holder(res, "c")
	const hold = 700 * time.Millisecond
	ec, _ := b.register(b.b1, "dead", res, c, hold) // the gate dies: no Leave
	deadline := b.inst.Deadline(b.t, ec)
	d := b.holder(res, "d")
	ed, lower := b.register(b.b2, "g2", res, d, longTTL)
	if !lower {
		b.t.Fatal("the dead gate's entry is not seen")
	}
	expired, err := b.b2.WaitLower(b.ctx, ed)
	if err != nil {
		b.t.Fatal(err)
	}
	if now := b.inst.Now(b.t); now.Before(deadline) {
		b.t.Fatalf("WaitLower passed at store time %v, before the dead gate's entry's deadline %v", now, deadline)
	}
	if expired != 1 {
		b.t.Fatalf("WaitLower removed %d expired entries, want 1", expired)
	}
	b.leave(b.b2, ed)
	b.wantEntries(res, 0)
}

func testBarrierRegistrationRemovesExpired(b *barrierSuite) {
	const res = "bar:expired"
	e := b.holder(res, "e")
	ee, _ := b.register(b.b1, "dead", res, e, time.Millisecond)
	deadline := b.inst.Deadline(b.t, ee)
	for b.inst.Now(b.t).Compare(deadline) <= 0 { // by the store's clock, not a guess
		time.Sleep(5 * time.Millisecond)
	}
	f := b.holder(res, "f")
	ef, lower := b.register(b.b2, "g2", res, f, longTTL)
	want := ef.Expired == 1 || b.h.DropsExpired && ef.Expired == 0
	if lower || !want {
		b.t.Fatalf("registration behind an expired entry: lower %v, expired %d; want false, 1 (or 0 when the store drops expired entries itself: %v)",
			lower, ef.Expired, b.h.DropsExpired)
	}
	b.wantEntries(res, 1)
	b.leave(b.b2, ef)
	b.wantEntries(res, 0)
}

func testBarrierClosedStoreFailsClosed(b *barrierSuite) {
	const res = "bar:closed"
	a := b.holder(res, "a")
	ea, _ := b.register(b.b1, "g1", res, a, longTTL)
	c := b.holder(res, "c")
	ec, _ := b.register(b.b2, "g2", res, c, longTTL)
	done := make(chan error, 1)
	go func() { _, err := b.b2.WaitLower(b.ctx, ec); done <- err }()
	time.Sleep(100 * time.Millisecond) // usually waiting by now; either way it must fail closed
	b.g2.Close()
	select {
	case err := <-done:
		if !fencing.IsStoreFault(err) {
			b.t.Fatalf("WaitLower on a store closed meanwhile: %v, want a store fault", err)
		}
	case <-time.After(30 * time.Second):
		b.t.Fatal("WaitLower did not end when its store closed")
	}
	if _, err := b.b2.WaitLower(b.ctx, ec); !errors.Is(err, fencing.ErrUnavailable) {
		b.t.Fatalf("WaitLower after Close: %v, want ErrUnavailable", err)
	}
	if _, _, _, err := b.b2.AdmitRegister(b.ctx, fencing.AdmitRequest{Resource: res, Token: c}, "g2", longTTL); !errors.Is(err, fencing.ErrUnavailable) {
		b.t.Fatalf("AdmitRegister after Close: %v, want ErrUnavailable", err)
	}
	b.leave(b.b1, ea)
}
