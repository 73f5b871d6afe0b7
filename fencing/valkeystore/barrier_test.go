package valkeystore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestSharedBarrier runs the shared barrier's contract against one server
// and a 3-node cluster.
func TestSharedBarrier(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := valkeytest.Start(t)
		testSharedBarrier(t, srv.URL(), srv.Do)
	})
	t.Run("cluster", func(t *testing.T) {
		cl := valkeytest.StartCluster(t, 3)
		testSharedBarrier(t, cl.URL(), cl.Nodes[0].Do)
	})
}

// newHolder hands res to a new owner and returns its token.
func newHolder(t *testing.T, s *Store, res, owner string) fencing.Token {
	t.Helper()
	ctx := context.Background()
	st, err := s.Status(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lease != nil {
		if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: st.Lease.Owner, Token: st.Lease.Token}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return l.Token
}

func testSharedBarrier(t *testing.T, url string, do func(...string) (string, error)) {
	ctx := context.Background()
	prefix := freshPrefix()
	g1, g2 := open(t, url, prefix), open(t, url, prefix) // two gates, two clients
	const res = "job:7"
	register := func(s *Store, gate string, tok fencing.Token, hold time.Duration) (fencing.BarrierEntry, bool) {
		t.Helper()
		_, e, lower, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: tok}, gate, hold)
		if err != nil {
			t.Fatalf("AdmitRegister(%d): %v", tok, err)
		}
		if !strings.Contains(e.ID, "|"+gate+":") {
			t.Fatalf("entry id %q does not name gate %s", e.ID, gate)
		}
		return e, lower
	}
	entries := func() int {
		t.Helper()
		n, err := do("ZCARD", prefix+":{"+res+"}:bar")
		if err != nil {
			t.Fatal(err)
		}
		c, _ := strconv.Atoi(n)
		return c
	}

	a := newHolder(t, g1, res, "a")
	ea, lower := register(g1, "g1", a, time.Minute)
	if lower {
		t.Fatal("first write reports a lower entry")
	}
	ea2, lower := register(g2, "g2", a, time.Minute)
	if lower {
		t.Fatal("an equal token waits for an equal one")
	}
	b := newHolder(t, g2, res, "b")
	eb, lower := register(g2, "g2", b, time.Minute)
	if !lower {
		t.Fatal("a higher token does not see the lower entries in flight through the other gate")
	}

	// A refused admission registers nothing.
	before := entries()
	if _, _, _, err := g1.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: a}, "g1", time.Minute); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("stale AdmitRegister: %v, want ErrStaleToken", err)
	}
	if _, _, _, err := g1.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: b + 1000}, "g1", time.Minute); !errors.Is(err, fencing.ErrTokenNotIssued) {
		t.Fatalf("unissued AdmitRegister: %v, want ErrTokenNotIssued", err)
	}
	if after := entries(); after != before {
		t.Fatalf("refused admissions changed the entries: %d -> %d", before, after)
	}

	// b waits while a lower entry remains, on either gate. The periodic
	// re-check is turned off: only a notification can wake the wait.
	recheck := barrierRecheck
	barrierRecheck = time.Hour
	defer func() { barrierRecheck = recheck }()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := g2.WaitLower(short, eb); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitLower with two lower entries: %v, want it to block until its context ends", err)
	}
	cancel()
	done := make(chan error, 1)
	go func() { _, err := g2.WaitLower(ctx, eb); done <- err }()
	if err := g1.Leave(ctx, ea); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("WaitLower returned (%v) while a lower entry of gate g2 remains", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := g2.Leave(ctx, ea2); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitLower after every lower entry left: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WaitLower was not woken by the Leave of the last lower entry")
	}
	if err := g2.Leave(ctx, eb); err != nil || g2.Leave(ctx, eb) != nil {
		t.Fatalf("Leave (twice): %v", err)
	}
	if n := entries(); n != 0 {
		t.Fatalf("%d entries left after every write left", n)
	}

	// A gate that dies with an entry registered: the entry blocks higher
	// tokens until its deadline (by the server's clock), then expires.
	c := newHolder(t, g1, res, "c")
	ec, _ := register(g1, "dead", c, 700*time.Millisecond)
	deadline, err := strconv.ParseInt(ec.ID[:strings.IndexByte(ec.ID, '|')], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	d := newHolder(t, g2, res, "d")
	ed, lower := register(g2, "g2", d, time.Minute)
	if !lower {
		t.Fatal("the dead gate's entry is not seen")
	}
	expired, err := g2.WaitLower(ctx, ed)
	if err != nil {
		t.Fatal(err)
	}
	now := serverMillis(t, do)
	if now < deadline {
		t.Fatalf("WaitLower passed at server time %d, before the dead gate's entry's deadline %d", now, deadline)
	}
	if expired != 1 {
		t.Fatalf("expired = %d, want 1", expired)
	}
	if err := g2.Leave(ctx, ed); err != nil {
		t.Fatal(err)
	}
	if n := entries(); n != 0 {
		t.Fatalf("%d entries left", n)
	}

	// A closed client fails a wait closed.
	e := newHolder(t, g1, res, "e")
	ee, _ := register(g1, "g1", e, time.Minute)
	f := newHolder(t, g1, res, "f")
	ef, _ := register(g2, "g2", f, time.Minute)
	go func() { _, err := g2.WaitLower(ctx, ef); done <- err }()
	time.Sleep(100 * time.Millisecond)
	g2.Close()
	if err := <-done; !fencing.IsStoreFault(err) {
		t.Fatalf("WaitLower on a closed store: %v, want a store fault", err)
	}
	_ = g1.Leave(ctx, ee)
}

// serverMillis is the server's TIME in milliseconds.
func serverMillis(t *testing.T, do func(...string) (string, error)) int64 {
	t.Helper()
	out, err := do("TIME")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("TIME: %q", out)
	}
	sec, _ := strconv.ParseInt(f[0], 10, 64)
	usec, _ := strconv.ParseInt(f[1], 10, 64)
	return sec*1000 + usec/1000
}
