package valkeystore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// openWait opens a store that confirms marks on n replicas, WAITing at most
// 300 ms (a bound on how long a failing case takes, not a threshold).
func openWait(t testing.TB, url, prefix string, n int, log *slog.Logger) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{URL: url, KeyPrefix: prefix, CommandTimeout: 2 * time.Second,
		DialTimeout: time.Second, WaitReplicas: n, WaitTimeout: 300 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatalf("Open(%s, WaitReplicas %d): %v", url, n, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func admit(s *Store, res string, tok fencing.Token) (fencing.Admission, error) {
	return s.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: tok})
}

// field reads one field of a resource's record from a node.
func field(t *testing.T, srv *valkeytest.Server, prefix, res, name string) string {
	t.Helper()
	return srv.MustDo("HGET", prefix+":{"+res+"}", name)
}

// admitEventually admits tok, retrying (bounded) while the outcome is
// ambiguous: a replica that just resumed or joined may take a moment before
// it acknowledges offsets again.
func admitEventually(t *testing.T, s *Store, res string, tok fencing.Token) fencing.Admission {
	t.Helper()
	var a fencing.Admission
	var err error
	for range 20 {
		if a, err = admit(s, res, tok); !errors.Is(err, fencing.ErrAmbiguous) {
			break
		}
	}
	if err != nil {
		t.Fatalf("Admit(%s, %d) with the replica up: %v", res, tok, err)
	}
	return a
}

func wantAmbiguous(t *testing.T, what string, a fencing.Admission, err error) {
	t.Helper()
	if !errors.Is(err, fencing.ErrAmbiguous) || a != (fencing.Admission{}) {
		t.Fatalf("%s: %+v, %v; want no admission and ErrAmbiguous", what, a, err)
	}
}

// The conformance suite holds with WaitReplicas on one server + one replica.
func TestConformanceWaitReplicas(t *testing.T) {
	p := valkeytest.Start(t)
	valkeytest.StartReplica(t, p)
	fencingtest.Run(t, fencingtest.Harness{Open: func(t testing.TB) fencingtest.Instance {
		prefix := freshPrefix()
		s := openWait(t, p.URL(), prefix, 1, nil)
		return fencingtest.Instance{Store: s, Reopen: func(t testing.TB) fencing.Store {
			s.Close()
			s = openWait(t, p.URL(), prefix, 1, nil)
			return s
		}, ClockTokens: true}
	}})
}

// A raise is reported only once the replica holds it; with the replica
// frozen or dead, raising (and relying on an unconfirmed mark) fails closed,
// while an admission at a confirmed mark needs no replica.
func TestWaitReplicas(t *testing.T) {
	p := valkeytest.Start(t)
	r := valkeytest.StartReplica(t, p)
	prefix := freshPrefix()
	s := openWait(t, p.URL(), prefix, 1, nil)
	ctx := context.Background()

	l1 := mustAcquire(t, s, "job", "alice")
	a, err := admit(s, "job", l1.Token)
	if err != nil || !a.Raised || a.HighWater != l1.Token {
		t.Fatalf("raising Admit with a healthy replica: %+v, %v", a, err)
	}
	// No polling: the WAIT already confirmed it.
	if got := field(t, r, prefix, "job", "hw"); got != l1.Token.String() {
		t.Fatalf("the replica's mark after a confirmed raise: %q, want %d", got, l1.Token)
	}
	if got := field(t, p, prefix, "job", "hwc"); got != l1.Token.String() {
		t.Fatalf("confirmed mark on the primary: %q, want %d", got, l1.Token)
	}

	// The replica hangs. A raise reaches the primary only: not admitted.
	r.Freeze()
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "alice", Token: l1.Token}); err != nil {
		t.Fatal(err)
	}
	l2 := mustAcquire(t, s, "job", "bob") // Acquire does not wait for replicas
	a, err = admit(s, "job", l2.Token)
	wantAmbiguous(t, "raising Admit with the replica frozen", a, err)
	if got := field(t, p, prefix, "job", "hw"); got != l2.Token.String() {
		t.Fatalf("primary mark after an unconfirmed raise: %q, want %d (raised, refusing older tokens)", got, l2.Token)
	}
	// The old token is refused by the primary's raised mark.
	if _, err := admit(s, "job", l1.Token); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("Admit of the superseded token: %v, want stale", err)
	}
	// An equal token relies on the same unconfirmed mark: it waits too.
	a, err = admit(s, "job", l2.Token)
	wantAmbiguous(t, "equal-token Admit at an unconfirmed mark", a, err)

	// The replica is back: the equal token is confirmed and admitted.
	r.Thaw()
	a = admitEventually(t, s, "job", l2.Token)
	if a.Raised || a.HighWater != l2.Token {
		t.Fatalf("equal-token Admit after the replica resumed: %+v, %v", a, err)
	}
	if got := field(t, r, prefix, "job", "hw"); got != l2.Token.String() {
		t.Fatalf("the replica's mark after the confirmed admission: %q, want %d", got, l2.Token)
	}
	if got := field(t, p, prefix, "job", "hwc"); got != l2.Token.String() {
		t.Fatalf("confirmed mark on the primary: %q, want %d", got, l2.Token)
	}

	// At a confirmed mark, admissions need no replica.
	r.Freeze()
	for range 3 {
		if a, err := admit(s, "job", l2.Token); err != nil || a.Raised {
			t.Fatalf("Admit at a confirmed mark with the replica frozen: %+v, %v", a, err)
		}
	}
	// Refusals are unchanged.
	if _, err := admit(s, "job", l2.Token+1e9); !errors.Is(err, fencing.ErrTokenNotIssued) {
		t.Fatalf("Admit of a token never issued: %v", err)
	}

	// The replica dies: raising fails closed.
	r.Kill()
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "bob", Token: l2.Token}); err != nil {
		t.Fatal(err)
	}
	l3 := mustAcquire(t, s, "job", "carol")
	a, err = admit(s, "job", l3.Token)
	wantAmbiguous(t, "raising Admit with the replica dead", a, err)
	// The unconfirmed raise still refuses older tokens.
	if a, err := admit(s, "job", l2.Token); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("Admit of bob's superseded token: %+v, %v, want stale", a, err)
	}
}

// A lost script (SCRIPT FLUSH) is reloaded, on the shared connections and
// on the dedicated one.
func TestWaitReplicasScriptFlush(t *testing.T) {
	p := valkeytest.Start(t)
	valkeytest.StartReplica(t, p)
	s := openWait(t, p.URL(), freshPrefix(), 1, nil)
	l := mustAcquire(t, s, "sf", "w")
	p.MustDo("SCRIPT", "FLUSH")
	if a, err := admit(s, "sf", l.Token); err != nil || !a.Raised {
		t.Fatalf("Admit after SCRIPT FLUSH: %+v, %v", a, err)
	}
	// The write mode alone, with the script gone: EVALSHA answers NOSCRIPT
	// and the EVAL fallback runs it, followed by its own WAIT.
	l2 := mustAcquire(t, s, "sf2", "w")
	p.MustDo("SCRIPT", "FLUSH")
	r, err := s.admitWaiting(context.Background(), fencing.AdmitRequest{Resource: "sf2", Token: l2.Token}, "0")
	if err != nil || r.kind != admitOK || !r.raised || !r.confirm || r.hw != l2.Token {
		t.Fatalf("write mode after SCRIPT FLUSH: %+v, %v", r, err)
	}
}

// Many goroutines admitting one new token: all succeed once confirmed.
func TestWaitReplicasConcurrent(t *testing.T) {
	p := valkeytest.Start(t)
	r := valkeytest.StartReplica(t, p)
	prefix := freshPrefix()
	s := openWait(t, p.URL(), prefix, 1, nil)
	l := mustAcquire(t, s, "hot", "w")
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			if _, err := admit(s, "hot", l.Token); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent Admit: %v", err)
	}
	if got := field(t, r, prefix, "hot", "hw"); got != l.Token.String() {
		t.Fatalf("the replica's mark: %q, want %d", got, l.Token)
	}
}

// With no replica at all, Open warns and raising fails closed.
func TestWaitReplicasWithoutReplica(t *testing.T) {
	p := valkeytest.Start(t)
	var buf bytes.Buffer
	s := openWait(t, p.URL(), freshPrefix(), 1, slog.New(slog.NewTextHandler(&buf, nil)))
	if !strings.Contains(buf.String(), "fewer connected replicas") {
		t.Fatalf("no warning about missing replicas: %q", buf.String())
	}
	l := mustAcquire(t, s, "lonely", "w")
	a, err := admit(s, "lonely", l.Token)
	wantAmbiguous(t, "raising Admit without replicas", a, err)
}

func TestOpenRefusesNegativeWait(t *testing.T) {
	p := valkeytest.Start(t)
	for _, o := range []Options{{URL: p.URL(), WaitReplicas: -1}, {URL: p.URL(), WaitReplicas: 1, WaitTimeout: -time.Second}} {
		if s, err := Open(context.Background(), o); err == nil {
			s.Close()
			t.Fatalf("Open(%+v) succeeded, want a refusal", o)
		}
	}
}

// In a cluster, the WAIT goes to the resource's primary: a resource on the
// primary with a replica is confirmed, one on a primary without replicas is
// not.
func TestWaitReplicasCluster(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	replica := cl.AddReplica(t, 0)
	prefix := freshPrefix()
	s := openWait(t, cl.URL(), prefix, 1, nil)
	// One resource owned by Nodes[0] (which has the replica), one not.
	var withReplica, without string
	for i := 0; i < 100 && (withReplica == "" || without == ""); i++ {
		res := fmt.Sprint("cw", i)
		mustAcquire(t, s, res, "w")
		if n, err := cl.Nodes[0].Do("EXISTS", prefix+":{"+res+"}"); err == nil && n == "1" {
			withReplica = cmp.Or(withReplica, res)
		} else {
			without = cmp.Or(without, res)
		}
	}
	if withReplica == "" || without == "" {
		t.Fatalf("no resources on both kinds of primary: %q %q", withReplica, without)
	}
	st, _ := s.Status(context.Background(), withReplica)
	if a := admitEventually(t, s, withReplica, st.Issued); a.HighWater != st.Issued {
		t.Fatalf("Admit on the primary with a replica: %+v", a)
	}
	st, _ = s.Status(context.Background(), without)
	a, err := admit(s, without, st.Issued)
	wantAmbiguous(t, "raising Admit on a primary without replicas", a, err)

	replica.Freeze()
	mustRelease := func(res string) fencing.Lease {
		st, _ := s.Status(context.Background(), res)
		if _, err := s.Release(context.Background(), fencing.ReleaseRequest{Resource: res, Owner: "w", Token: st.Issued}); err != nil {
			t.Fatal(err)
		}
		return mustAcquire(t, s, res, "w2")
	}
	l := mustRelease(withReplica)
	a, err = admit(s, withReplica, l.Token)
	wantAmbiguous(t, "raising Admit with the cluster replica frozen", a, err)
}
