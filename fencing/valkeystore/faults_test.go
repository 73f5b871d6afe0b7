package valkeystore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// retryFaults runs op until it returns something other than a store fault
// (bounded). After a server restart the client's other pooled connections
// are still broken: their first use fails closed (ambiguous) and reconnects.
func retryFaults(op func() error) error {
	var err error
	for range 40 {
		if err = op(); !fencing.IsStoreFault(err) {
			return err
		}
		time.Sleep(25 * time.Millisecond)
	}
	return err
}

func mustAcquire(t *testing.T, s *Store, res, owner string) fencing.Lease {
	t.Helper()
	var l fencing.Lease
	err := retryFaults(func() (err error) {
		l, err = s.Acquire(context.Background(), fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Minute})
		return err
	})
	if err != nil {
		t.Fatalf("Acquire(%s, %s): %v", res, owner, err)
	}
	return l
}

func mustAdmit(t *testing.T, s *Store, res string, tok fencing.Token) {
	t.Helper()
	err := retryFaults(func() error {
		_, err := s.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: tok})
		return err
	})
	if err != nil {
		t.Fatalf("Admit(%s, %d): %v", res, tok, err)
	}
}

// wantRefused fails unless admitting tok is refused as stale or not issued
// (a domain refusal: the store answered and said no). Faults are retried:
// they fail closed too, but the test wants the store's answer.
func wantRefused(t *testing.T, s *Store, res string, tok fencing.Token) {
	t.Helper()
	err := retryFaults(func() error {
		_, err := s.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: tok})
		return err
	})
	if !errors.Is(err, fencing.ErrStaleToken) && !errors.Is(err, fencing.ErrTokenNotIssued) {
		t.Fatalf("Admit(%s, %d) of a token issued before the loss: %v, want a stale or not-issued refusal", res, tok, err)
	}
}

// untilAnswers retries Ping until the store answers again (after a restart
// the client reconnects on its own).
func untilAnswers(t *testing.T, s *Store) {
	t.Helper()
	var err error
	for range 100 {
		if err = s.Ping(context.Background()); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("store did not answer after the restart: %v", err)
}

// TestStoreLoss: after the server loses its data, a token issued before the
// loss is never admitted and new tokens are above every earlier token; for
// the store that saw the loss and for one opened afterwards.
func TestStoreLoss(t *testing.T) {
	// The control, a restart with persistence, is TestPersistenceKeepsState.
	losses := map[string]func(srv *valkeytest.Server){
		"FLUSHALL":                  func(srv *valkeytest.Server) { srv.MustDo("FLUSHALL") },
		"RestartWithoutPersistence": func(srv *valkeytest.Server) { srv.Restart() },
	}
	for name, lose := range losses {
		t.Run(name, func(t *testing.T) {
			srv := valkeytest.Start(t)
			prefix := freshPrefix()
			s := open(t, srv.URL(), prefix)
			// r1: live lease, token admitted. r2: lease taken, never
			// admitted. r3: several generations, last one released.
			l1 := mustAcquire(t, s, "r1", "alice")
			mustAdmit(t, s, "r1", l1.Token)
			l2 := mustAcquire(t, s, "r2", "bob")
			var l3 fencing.Lease
			for i := range 3 {
				l3 = mustAcquire(t, s, "r3", fmt.Sprint("w", i))
				if _, err := s.Release(context.Background(), fencing.ReleaseRequest{Resource: "r3", Owner: l3.Owner, Token: l3.Token}); err != nil {
					t.Fatal(err)
				}
			}
			before := map[string]fencing.Token{"r1": l1.Token, "r2": l2.Token, "r3": l3.Token}

			lose(srv)
			untilAnswers(t, s)
			fresh := open(t, srv.URL(), prefix)

			for _, st := range []*Store{s, fresh} {
				for res, tok := range before {
					wantRefused(t, st, res, tok)
				}
			}
			for res, tok := range before {
				// New holders get tokens above every pre-loss token...
				nl := mustAcquire(t, fresh, res, "newcomer")
				if nl.Token <= tok {
					t.Fatalf("%s: token after the loss %d, want > %d issued before", res, nl.Token, tok)
				}
				// ...and the stale tokens stay refused, before and after
				// the new holder writes, on every store.
				for _, st := range []*Store{s, fresh} {
					wantRefused(t, st, res, tok)
				}
				mustAdmit(t, s, res, nl.Token)
				wantRefused(t, fresh, res, tok)
			}
			// A worker that still believes it holds r1 cannot renew.
			err := retryFaults(func() error {
				_, err := s.Renew(context.Background(), fencing.RenewRequest{Resource: "r1", Owner: "alice", Token: l1.Token})
				return err
			})
			if !errors.Is(err, fencing.ErrLeaseLost) {
				t.Fatalf("Renew of a pre-loss lease: %v, want ErrLeaseLost", err)
			}
		})
	}
}

// TestRollbackNeverReissues simulates a failover to a lagging replica: the
// record goes back to an older state (DUMP/RESTORE). Tokens issued after the
// snapshot are not issued again, because tokens follow the server clock.
func TestRollbackNeverReissues(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	s := open(t, srv.URL(), prefix)
	ctx := context.Background()
	key := prefix + ":{roll}"
	l := mustAcquire(t, s, "roll", "a")
	s.Release(ctx, fencing.ReleaseRequest{Resource: "roll", Owner: "a", Token: l.Token})
	snapshot := srv.MustDo("DUMP", key)
	seen := map[fencing.Token]bool{l.Token: true}
	var top fencing.Token
	for i := range 5 {
		l := mustAcquire(t, s, "roll", fmt.Sprint("b", i))
		seen[l.Token] = true
		top = l.Token
		s.Release(ctx, fencing.ReleaseRequest{Resource: "roll", Owner: l.Owner, Token: l.Token})
	}
	srv.MustDo("RESTORE", key, "0", snapshot, "REPLACE")
	if st, _ := s.Status(ctx, "roll"); st.Issued >= top {
		t.Fatalf("restore did not roll back: issued %d", st.Issued)
	}
	for i := range 5 {
		l := mustAcquire(t, s, "roll", fmt.Sprint("c", i))
		if seen[l.Token] || l.Token <= top {
			t.Fatalf("token %d after the rollback: issued before (newest was %d)", l.Token, top)
		}
		seen[l.Token] = true
		s.Release(ctx, fencing.ReleaseRequest{Resource: "roll", Owner: l.Owner, Token: l.Token})
	}
}

func TestPersistenceKeepsState(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.WithPersistence())
	s := open(t, srv.URL(), freshPrefix())
	l := mustAcquire(t, s, "p", "alice")
	mustAdmit(t, s, "p", l.Token)
	srv.Restart()
	untilAnswers(t, s)
	var st fencing.Status
	err := retryFaults(func() (err error) {
		st, err = s.Status(context.Background(), "p")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Lease == nil || st.Lease.Token != l.Token || st.HighWater != l.Token || st.Issued != l.Token {
		t.Fatalf("status after an AOF restart %+v, want the live lease %d and marks kept", st, l.Token)
	}
	mustAdmit(t, s, "p", l.Token)
}

// TestScriptFlush: after SCRIPT FLUSH the scripts are reloaded (EVALSHA gets
// NOSCRIPT, valkey-go falls back to EVAL) and every operation still works.
func TestScriptFlush(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	ctx := context.Background()
	l := mustAcquire(t, s, "sf", "alice")
	mustAdmit(t, s, "sf", l.Token)
	sha := admitSrcSHA1
	if got := srv.MustDo("SCRIPT", "EXISTS", sha); got != "1" {
		t.Fatalf("admit script not cached before the flush: %s", got)
	}
	srv.MustDo("SCRIPT", "FLUSH")
	if got := srv.MustDo("SCRIPT", "EXISTS", sha); got != "0" {
		t.Fatalf("admit script still cached after SCRIPT FLUSH: %s", got)
	}
	mustAdmit(t, s, "sf", l.Token)
	if got := srv.MustDo("SCRIPT", "EXISTS", sha); got != "1" {
		t.Fatalf("admit script not reloaded after SCRIPT FLUSH: %s", got)
	}
	if _, err := s.Renew(ctx, fencing.RenewRequest{Resource: "sf", Owner: "alice", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: "sf", Owner: "alice", Token: l.Token, State: []byte(`[1]`)}); err != nil {
		t.Fatal(err)
	}
	if cp, err := s.ReadCheckpoint(ctx, "sf"); err != nil || string(cp.State) != `[1]` {
		t.Fatalf("ReadCheckpoint after flush: %+v, %v", cp, err)
	}
	if ls, err := s.List(ctx, fencing.ListRequest{}); err != nil || len(ls) != 1 {
		t.Fatalf("List after flush: %+v, %v", ls, err)
	}
	if ok, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "sf", Owner: "alice", Token: l.Token}); !ok || err != nil {
		t.Fatalf("Release after flush: %v, %v", ok, err)
	}
	if l2 := mustAcquire(t, s, "sf", "bob"); l2.Token <= l.Token {
		t.Fatalf("token %d after flush, want > %d", l2.Token, l.Token)
	}
}

// TestKilledServerFailsClosed kills the server while many admissions and
// acquisitions are in flight: every call either succeeded or failed with
// ErrUnavailable or ErrAmbiguous, and none begun after the server died
// succeeds. (A call begun before may still succeed a moment after: its
// answer was on its way when the server died.)
func TestKilledServerFailsClosed(t *testing.T) {
	srv := valkeytest.Start(t)
	s, err := Open(context.Background(), Options{URL: srv.URL(), KeyPrefix: freshPrefix(), CommandTimeout: 500 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := mustAcquire(t, s, "k", "alice")

	var killed time.Time
	var mu sync.Mutex
	type outcome struct {
		began, at time.Time
		err       error
	}
	var outcomes []outcome
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				began := time.Now()
				if w%2 == 0 {
					_, err = s.Admit(context.Background(), fencing.AdmitRequest{Resource: "k", Token: l.Token})
				} else {
					_, err = s.Acquire(context.Background(), fencing.AcquireRequest{Resource: fmt.Sprintf("k%d-%d", w, i), Owner: "o", TTL: time.Minute})
				}
				mu.Lock()
				outcomes = append(outcomes, outcome{began, time.Now(), err})
				mu.Unlock()
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	srv.Kill()
	mu.Lock()
	killed = time.Now()
	mu.Unlock()
	time.Sleep(700 * time.Millisecond)
	close(stop)
	wg.Wait()

	var ok, afterKill, unavailable, ambiguous int
	for _, o := range outcomes {
		switch {
		case o.err == nil:
			ok++
			if o.began.After(killed) {
				t.Fatalf("a call begun %v after the server was killed succeeded", o.began.Sub(killed))
			}
		case errors.Is(o.err, fencing.ErrUnavailable):
			unavailable++
		case errors.Is(o.err, fencing.ErrAmbiguous):
			ambiguous++
		default:
			t.Fatalf("call failed with %v: want ErrUnavailable or ErrAmbiguous", o.err)
		}
		if o.at.After(killed) {
			afterKill++
		}
	}
	t.Logf("%d calls: %d succeeded, %d unavailable, %d ambiguous", len(outcomes), ok, unavailable, ambiguous)
	if ok == 0 || afterKill == 0 {
		t.Fatalf("the test did not exercise both sides of the kill (ok %d, after kill %d)", ok, afterKill)
	}
	// With the server gone, a new call cannot connect: unavailable.
	_, err = s.Admit(context.Background(), fencing.AdmitRequest{Resource: "k", Token: l.Token})
	if !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Admit with the server down: %v, want ErrUnavailable", err)
	}
	_, err = s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "k2", Owner: "o", TTL: time.Minute})
	if !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Acquire with the server down: %v, want ErrUnavailable", err)
	}
}

// TestTimeoutAfterSendIsAmbiguous: the server receives the script but does
// not run it in time (CLIENT PAUSE). The call fails as ambiguous: whether
// the acquisition took effect depends on whether the server ran it before
// the client dropped the connection, which is exactly why the gate must not
// assume either outcome.
func TestTimeoutAfterSendIsAmbiguous(t *testing.T) {
	srv := valkeytest.Start(t)
	s, err := Open(context.Background(), Options{URL: srv.URL(), KeyPrefix: freshPrefix(), CommandTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustAcquire(t, s, "warm", "x") // scripts loaded, connection up
	srv.MustDo("CLIENT", "PAUSE", "1000", "ALL")
	_, err = s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "amb", Owner: "alice", TTL: time.Minute})
	if !errors.Is(err, fencing.ErrAmbiguous) {
		t.Fatalf("Acquire during a pause longer than the timeout: %v, want ErrAmbiguous", err)
	}
	_, err = s.Admit(context.Background(), fencing.AdmitRequest{Resource: "warm", Token: 1})
	if !errors.Is(err, fencing.ErrAmbiguous) {
		t.Fatalf("Admit during the pause: %v, want ErrAmbiguous", err)
	}
	var st fencing.Status
	for range 100 { // the pause ends within a second
		if st, err = s.Status(context.Background(), "amb"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || st.Lease != nil && st.Lease.Owner != "alice" {
		t.Fatalf("status after the pause: %+v, %v", st, err)
	}
	t.Logf("the ambiguous acquire took effect: %v", st.Lease != nil)
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	s.Close()
	if err := s.Ping(context.Background()); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Ping after Close: %v", err)
	}
	if _, err := s.List(context.Background(), fencing.ListRequest{}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("List after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestCloseDuringCallIsAmbiguous: Close while an acquire has been sent but
// not answered (the server holds it: CLIENT PAUSE WRITE) must report
// ErrAmbiguous, not ErrUnavailable ("not performed"): whether the server
// runs it depends on where it was (here, a paused command is dropped with
// its connection; a command still in the socket buffer of a busy server is
// run once the server reads it).
func TestCloseDuringCallIsAmbiguous(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	s, err := Open(context.Background(), Options{URL: srv.URL(), KeyPrefix: prefix, CommandTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, "warm", "x") // connection up, script loaded
	srv.MustDo("CLIENT", "PAUSE", "10000", "WRITE")
	unpaused := false
	defer func() {
		if !unpaused {
			srv.Do("CLIENT", "UNPAUSE")
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "inflight", Owner: "alice", TTL: time.Minute})
		done <- err
	}()
	held := false
	for range 400 { // until the server holds the acquire
		if list, err := srv.Do("CLIENT", "LIST"); err == nil && strings.Contains(list, "cmd=evalsha") {
			held = true
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !held {
		t.Fatal("the acquire never reached the paused server")
	}
	s.Close()
	err = <-done
	srv.MustDo("CLIENT", "UNPAUSE")
	unpaused = true
	if errors.Is(err, fencing.ErrUnavailable) || !errors.Is(err, fencing.ErrAmbiguous) {
		t.Fatalf("acquire in flight during Close: %v, want ErrAmbiguous", err)
	}
}

// TestBatchAfterScriptFlush: a batch sent after SCRIPT FLUSH gets NOSCRIPT
// for every call; each is run again through Admit's path, which loads the
// script, and answered as if nothing had happened. A batch on a closed
// store fails every call as unavailable and sends nothing.
func TestBatchAfterScriptFlush(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	ctx := context.Background()
	a := mustAcquire(t, s, "bf:a", "alice")
	b := mustAcquire(t, s, "bf:b", "bob")
	mustAdmit(t, s, "bf:a", a.Token)
	srv.MustDo("SCRIPT", "FLUSH")
	reqs := []fencing.AdmitRequest{{Resource: "bf:a", Token: a.Token}, {Resource: "bf:b", Token: b.Token}, {Resource: "bf:a", Token: a.Token + 1}}
	out := make([]fencing.Admission, len(reqs))
	errs := make([]error, len(reqs))
	s.AdmitBatch(ctx, reqs, out, errs)
	var notIssued *fencing.TokenNotIssuedError
	if errs[0] != nil || errs[1] != nil || out[0].HighWater != a.Token || out[0].Raised || !out[1].Raised || !errors.As(errs[2], &notIssued) {
		t.Fatalf("batch after SCRIPT FLUSH: %+v, %v", out, errs)
	}
	if got := srv.MustDo("SCRIPT", "EXISTS", admitSrcSHA1); got != "1" {
		t.Fatalf("admit script not reloaded by the batch: %s", got)
	}
	s.Close()
	s.AdmitBatch(ctx, reqs[:2], out, errs)
	for i, err := range errs[:2] {
		if !errors.Is(err, fencing.ErrUnavailable) {
			t.Fatalf("batch on a closed store: answer %d is %v, want unavailable", i, err)
		}
	}
}

// TestBatchMarkReadSkipsTheRead: a batched request marked MarkRead (a
// mark reader read it and did not settle it) runs admit.lua without a
// second read of its marks, and is answered as without the mark: the
// raise of a fresh lease's token costs one command, not two.
func TestBatchMarkReadSkipsTheRead(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	ctx := context.Background()
	hmgets := func() int {
		for _, line := range strings.Split(srv.MustDo("INFO", "commandstats"), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_hmget:calls="); ok {
				n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
				return n
			}
		}
		return 0
	}
	raise := func(res string, markRead bool) (fencing.Admission, int) {
		l := mustAcquire(t, s, res, "alice")
		out, errs := make([]fencing.Admission, 1), make([]error, 1)
		before := hmgets()
		s.AdmitBatch(ctx, []fencing.AdmitRequest{{Resource: res, Token: l.Token, MarkRead: markRead}}, out, errs)
		if errs[0] != nil || !out[0].Raised || out[0].HighWater != l.Token {
			t.Fatalf("raise of %s (MarkRead %v): %+v, %v", res, markRead, out[0], errs[0])
		}
		return out[0], hmgets() - before
	}
	_, plain := raise("mr:a", false)
	_, marked := raise("mr:b", true)
	// admit.lua reads the record with one HMGET of its own (counted too);
	// the batch's read before it is the one MarkRead leaves out.
	if plain != marked+1 {
		t.Fatalf("HMGETs for a raise: %d without MarkRead, %d with it; want one fewer with it", plain, marked)
	}
}
