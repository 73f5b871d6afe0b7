package valkeystore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// refusedClosed fails t unless err is a fault that promises nothing was
// done (fencing.ErrUnavailable, not ambiguous) and says the node is not the
// primary.
func refusedClosed(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous) || !strings.Contains(err.Error(), "primary") {
		t.Errorf("%s on a node that is not the primary: %v, want ErrUnavailable naming the primary", what, err)
	}
}

// failsEverywhere checks that every admission path of s (Ping, Admit,
// AdmitBatch, a mark reader) fails closed for req.
func failsEverywhere(t *testing.T, s *Store, req fencing.AdmitRequest) {
	t.Helper()
	ctx := context.Background()
	refusedClosed(t, "Ping", s.Ping(ctx))
	ad, err := s.Admit(ctx, req)
	if err == nil {
		t.Errorf("Admit(%d): admitted at high-water %d", req.Token, ad.HighWater)
	} else {
		refusedClosed(t, "Admit", err)
	}
	out, errs := make([]fencing.Admission, 1), make([]error, 1)
	s.AdmitBatch(ctx, []fencing.AdmitRequest{req}, out, errs)
	refusedClosed(t, "AdmitBatch", errs[0])
	mr, err := s.OpenMarkReader(ctx)
	if err != nil {
		t.Fatalf("OpenMarkReader: %v", err)
	}
	if mr != nil { // Linux only
		defer mr.Close()
		_, err := mr.Send(time.Now(), []fencing.AdmitRequest{req})
		refusedClosed(t, "a mark reader's Send", err)
	}
}

// TestReplicaIsRefusedAtOpen: a store URL naming a replica (read-only, or
// writable with replica-read-only no) is refused at Open with a store
// fault that names the address and asks for the primary: a replica answers
// admissions at the mark from a copy that may be behind the primary's
// (here a replica cut off from it), so a token the primary has superseded
// would be admitted after the newer one.
func TestReplicaIsRefusedAtOpen(t *testing.T) {
	p := valkeytest.Start(t)
	r := valkeytest.StartReplica(t, p)
	prefix := freshPrefix()
	a := open(t, p.URL(), prefix)
	old := mustAcquire(t, a, "job", "alice")
	mustAdmit(t, a, "job", old.Token)
	if n := p.MustDo("WAIT", "1", "2000"); n != "1" {
		t.Fatalf("WAIT: %s", n)
	}
	r.MustDo("REPLICAOF", "127.0.0.1", "1") // cut off: stays a replica, serving its stale copy
	ctx := context.Background()
	opts := Options{URL: r.URL(), KeyPrefix: prefix, CommandTimeout: 2 * time.Second, DialTimeout: time.Second}
	for _, readOnly := range []string{"yes", "no"} {
		r.MustDo("CONFIG", "SET", "replica-read-only", readOnly)
		b, err := Open(ctx, opts)
		if err == nil {
			b.Close()
			t.Fatalf("Open on a replica (replica-read-only %s) succeeded", readOnly)
		}
		if !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), r.Addr()) || !strings.Contains(err.Error(), "needs the primary") {
			t.Errorf("Open on a replica (replica-read-only %s): %v, want ErrUnavailable naming %s and the primary", readOnly, err, r.Addr())
		}
	}
	// The primary is unaffected.
	if _, err := a.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "alice", Token: old.Token}); err != nil {
		t.Fatal(err)
	}
	newer := mustAcquire(t, a, "job", "bob")
	mustAdmit(t, a, "job", newer.Token)
}

// TestReplicaIsRefusedAfterDemotion: the node a store was opened on (the
// primary then) is demoted by a failover (the replica promoted, REPLICAOF
// on the old primary) and cut off from the new primary. Within the
// periodic check, Ping turns red and every admission path fails closed, so
// the token superseded through the new primary is never admitted through
// the demoted node; promoted again, the node serves again.
func TestReplicaIsRefusedAfterDemotion(t *testing.T) {
	p := valkeytest.Start(t)
	r := valkeytest.StartReplica(t, p)
	prefix := freshPrefix()
	ctx := context.Background()
	b, err := Open(ctx, Options{URL: p.URL(), KeyPrefix: prefix, PolicyCheckInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	old := mustAcquire(t, b, "job", "alice")
	mustAdmit(t, b, "job", old.Token)
	if n := p.MustDo("WAIT", "1", "2000"); n != "1" {
		t.Fatalf("WAIT: %s", n)
	}

	// Failover: r promoted, p demoted (and then cut off from r).
	r.MustDo("REPLICAOF", "NO", "ONE")
	p.MustDo("REPLICAOF", "127.0.0.1", "1")
	a := open(t, r.URL(), prefix) // gate A follows the failover
	if _, err := a.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "alice", Token: old.Token}); err != nil {
		t.Fatal(err)
	}
	newer := mustAcquire(t, a, "job", "bob")
	mustAdmit(t, a, "job", newer.Token)

	until(t, "Ping fails on the demoted node", func() bool { return b.Ping(ctx) != nil })
	if err := b.Ping(ctx); !strings.Contains(err.Error(), p.Addr()) {
		t.Errorf("Ping on the demoted node: %v, want it to name %s", err, p.Addr())
	}
	failsEverywhere(t, b, fencing.AdmitRequest{Resource: "job", Token: old.Token})

	// p is the primary again (with its own, older copy): b serves again.
	p.MustDo("REPLICAOF", "NO", "ONE")
	until(t, "Ping recovers", func() bool { return b.Ping(ctx) == nil })
	mustAdmit(t, b, "job", old.Token)
}

// TestReplicaIsRefusedOnReadOnly: a READONLY reply (a write on a node
// demoted since the last check) is reported not performed and fails every
// later call closed at once, the admission at the mark (which a read-only
// replica runs) included, without waiting for the periodic check; the
// check clears it once the node is the primary again.
func TestReplicaIsRefusedOnReadOnly(t *testing.T) {
	p := valkeytest.Start(t)
	prefix := freshPrefix()
	ctx := context.Background()
	s, err := Open(ctx, Options{URL: p.URL(), KeyPrefix: prefix, PolicyCheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := mustAcquire(t, s, "job", "alice")
	mustAdmit(t, s, "job", l.Token)
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	p.MustDo("REPLICAOF", "127.0.0.1", "1") // demoted: a read-only replica with no primary
	_, err = s.Acquire(ctx, fencing.AcquireRequest{Resource: "other", Owner: "b", TTL: time.Minute})
	if !errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous) || !strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("Acquire on the demoted node: %v, want ErrUnavailable (READONLY, not performed)", err)
	}
	failsEverywhere(t, s, fencing.AdmitRequest{Resource: "job", Token: l.Token})

	p.MustDo("REPLICAOF", "NO", "ONE")
	s.recheck(policyState{persistence: map[string]string{}})
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after the node is the primary again and checked: %v", err)
	}
	mustAdmit(t, s, "job", l.Token)
}
