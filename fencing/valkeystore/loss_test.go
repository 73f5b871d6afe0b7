package valkeystore

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// aheadBy emulates a server node whose clock is ahead by d: it issues the
// next token of res from a counter moved d past the server's clock, as
// acquire.lua does on such a node (max(issued+1, its now_us)). It returns
// the lease of the new owner.
func aheadBy(t *testing.T, srv *valkeytest.Server, s *Store, res, owner string, d time.Duration) fencing.Lease {
	t.Helper()
	now := time.Now().UnixMicro()
	srv.MustDo("HSET", s.recKey(res), "issued", strconv.FormatInt(now+d.Microseconds(), 10))
	l := mustAcquire(t, s, res, owner)
	if l.Token <= fencing.Token(now+d.Microseconds()/2) {
		t.Fatalf("token %d is not ahead of the clock (now %d µs)", l.Token, now)
	}
	return l
}

func admitToken(s *Store, res string, tok fencing.Token) error {
	_, err := s.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: tok})
	return err
}

func wantStaleToken(t *testing.T, err error, beforeLoss bool, what string) {
	t.Helper()
	var stale *fencing.StaleTokenError
	if !errors.As(err, &stale) || stale.BeforeLoss != beforeLoss {
		t.Fatalf("%s: %v, want a stale token (before the loss: %v)", what, err, beforeLoss)
	}
}

// TestFlushAllWithServerClockBehind: X was issued by a node whose clock was
// ahead and admitted; the data is lost (FLUSHALL). The next token is above X
// although the server clock is behind it, and X is refused before and after
// the new holder's write, and after a third acquisition.
func TestFlushAllWithServerClockBehind(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	ctx := context.Background()
	old := mustAcquire(t, s, "job", "a")
	s.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "a", Token: old.Token})
	x := aheadBy(t, srv, s, "job", "b", time.Minute)
	mustAdmit(t, s, "job", x.Token)

	srv.MustDo("FLUSHALL")

	t1 := mustAcquire(t, s, "job", "c")
	if t1.Token <= x.Token {
		t.Fatalf("token after the loss %d, not above the pre-loss token %d", t1.Token, x.Token)
	}
	wantStaleToken(t, admitToken(s, "job", x.Token), true, "pre-loss token before the post-loss write")
	mustAdmit(t, s, "job", t1.Token)
	wantStaleToken(t, admitToken(s, "job", x.Token), false, "pre-loss token after the post-loss write")
	s.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "c", Token: t1.Token})
	t2 := mustAcquire(t, s, "job", "d")
	if t2.Token <= t1.Token {
		t.Fatalf("third token %d, want above %d", t2.Token, t1.Token)
	}
	wantStaleToken(t, admitToken(s, "job", x.Token), false, "pre-loss token after a third acquisition")
}

// TestLossSeenByAnotherGate: gate A saw X; after FLUSHALL, gate B (which
// never saw the resource) issues T1 < X and admits T1's write, and a later
// acquisition through B moves issued past X. Gate A's first admission for
// the resource notices that the record is not the one it saw, lifts it
// past X and fails with ErrStoreLost; from then on no gate admits X or T1.
func TestLossSeenByAnotherGate(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	a := open(t, srv.URL(), prefix)
	b := open(t, srv.URL(), prefix)
	ctx := context.Background()
	x := aheadBy(t, srv, a, "job", "x", time.Minute)
	mustAdmit(t, a, "job", x.Token)

	srv.MustDo("FLUSHALL")

	t1 := mustAcquire(t, b, "job", "t1")
	if t1.Token >= x.Token {
		t.Fatalf("gate B issued %d, want below X %d for this test to mean anything", t1.Token, x.Token)
	}
	mustAdmit(t, b, "job", t1.Token)
	// A later acquisition through B, once the clock passed X: emulated by
	// moving the counter, as the clock would.
	b.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "t1", Token: t1.Token})
	t3 := aheadBy(t, srv, b, "job", "t3", 2*time.Minute)

	if err := admitToken(a, "job", x.Token); !errors.Is(err, fencing.ErrStoreLost) {
		t.Fatalf("gate A admitting X after the loss: %v, want ErrStoreLost", err)
	}
	for _, g := range []*Store{a, b} {
		for _, tok := range []fencing.Token{x.Token, t1.Token} {
			if err := admitToken(g, "job", tok); !errors.Is(err, fencing.ErrStaleToken) {
				t.Fatalf("admitting %d after the lift: %v, want stale", tok, err)
			}
		}
	}
	// t3 was issued before the lift and is below it too: its holder
	// acquires again and gets a token above X.
	if err := admitToken(b, "job", t3.Token); err == nil && t3.Token <= x.Token {
		t.Fatalf("t3 %d admitted though at or below X %d", t3.Token, x.Token)
	}
	n := mustAcquire(t, b, "job", "next")
	if n.Token <= x.Token {
		t.Fatalf("token after the lift %d, want above X %d", n.Token, x.Token)
	}
	mustAdmit(t, a, "job", n.Token)
}

// TestRolledBackRecordIsStoreLost: a record that goes back to an older
// version (a failover to a lagging replica) is noticed by the next
// admission through a gate that saw the newer version.
func TestRolledBackRecordIsStoreLost(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	ctx := context.Background()
	key := s.recKey("roll")
	first := mustAcquire(t, s, "roll", "a")
	mustAdmit(t, s, "roll", first.Token)
	snapshot := srv.MustDo("DUMP", key)
	s.Release(ctx, fencing.ReleaseRequest{Resource: "roll", Owner: "a", Token: first.Token})
	second := mustAcquire(t, s, "roll", "b")
	mustAdmit(t, s, "roll", second.Token)
	srv.MustDo("RESTORE", key, "0", snapshot, "REPLACE")

	if err := admitToken(s, "roll", first.Token); !errors.Is(err, fencing.ErrStoreLost) {
		t.Fatalf("superseded token on a rolled-back record: %v, want ErrStoreLost", err)
	}
	wantStaleToken(t, admitToken(s, "roll", first.Token), true, "superseded token after the lift")
	wantStaleToken(t, admitToken(s, "roll", second.Token), true, "newest pre-loss token after the lift")
	if l := mustAcquire(t, s, "roll", "c"); l.Token <= second.Token {
		t.Fatalf("token after the rollback %d, want above %d", l.Token, second.Token)
	}
}

// lostMarkRaise sets up a record that lost only the admission that raised
// its high-water mark to the newer holder's token (a failover to a replica
// that missed it, a restart whose AOF lost its last second, a backup taken
// between the acquisition and the write): its issued counter and floor are
// the ones s saw, and the superseded token first is at the mark again.
func lostMarkRaise(t *testing.T) (s *Store, first, second fencing.Lease) {
	t.Helper()
	srv := valkeytest.Start(t)
	s = open(t, srv.URL(), freshPrefix())
	key := s.recKey("mark")
	first = mustAcquire(t, s, "mark", "a")
	mustAdmit(t, s, "mark", first.Token)
	s.Release(context.Background(), fencing.ReleaseRequest{Resource: "mark", Owner: "a", Token: first.Token})
	second = mustAcquire(t, s, "mark", "b")
	snapshot := srv.MustDo("DUMP", key) // issued: second; hw: first
	mustAdmit(t, s, "mark", second.Token)
	srv.MustDo("RESTORE", key, "0", snapshot, "REPLACE")
	return s, first, second
}

// wantLostMarkRaiseRefused checks the answer err to the superseded token's
// first admission on lostMarkRaise's record, and what follows it.
func wantLostMarkRaiseRefused(t *testing.T, s *Store, first, second fencing.Lease, err error) {
	t.Helper()
	if !errors.Is(err, fencing.ErrStoreLost) {
		t.Fatalf("superseded token after its successor's write was lost: %v, want ErrStoreLost", err)
	}
	wantStaleToken(t, admitToken(s, "mark", first.Token), true, "superseded token after the lift")
	if l := mustAcquire(t, s, "mark", "c"); l.Token <= second.Token {
		t.Fatalf("token after the loss %d, want above %d", l.Token, second.Token)
	}
}

// TestLostMarkRaiseIsStoreLost: a gate that admitted the newer holder's
// write does not admit the superseded token after it once the store lost
// that admission (see lostMarkRaise), through Admit or AdmitBatch.
func TestLostMarkRaiseIsStoreLost(t *testing.T) {
	ctx := context.Background()
	t.Run("admit", func(t *testing.T) {
		s, first, second := lostMarkRaise(t)
		_, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "mark", Token: first.Token})
		wantLostMarkRaiseRefused(t, s, first, second, err)
	})
	t.Run("batch", func(t *testing.T) {
		s, first, second := lostMarkRaise(t)
		errs := make([]error, 1)
		s.AdmitBatch(ctx, []fencing.AdmitRequest{{Resource: "mark", Token: first.Token}}, make([]fencing.Admission, 1), errs)
		wantLostMarkRaiseRefused(t, s, first, second, errs[0])
	})
}
