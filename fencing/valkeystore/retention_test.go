package valkeystore

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// pttl is a key's PTTL in ms (-1: no expiry, -2: no key).
func pttl(t *testing.T, srv *valkeytest.Server, key string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(srv.MustDo("PTTL", key), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRetentionTTLs pins the keys' expiry: the record and its checkpoint
// expire the retention past the live lease's end while one is live, the
// retention past the release once it ended; retention 0 keeps them (and
// takes a TTL an earlier retention left away).
func TestRetentionTTLs(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	const ret, ttl = time.Hour, 10 * time.Minute
	s := openRetention(t, srv.URL(), prefix, ret)
	ctx := context.Background()
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: "r", Owner: "a", Token: l.Token, State: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	// PTTLs only go down with time: bounded above by what was set, below
	// by what was set minus the time since (generous: a busy machine).
	within := func(what string, got int64, want time.Duration) {
		t.Helper()
		if got > want.Milliseconds() || got < (want-time.Minute).Milliseconds() {
			t.Fatalf("%s: PTTL %d ms, want about %v", what, got, want)
		}
	}
	for _, k := range []string{s.recKey("r"), s.stateKey("r")} {
		within(k+" with a live lease", pttl(t, srv, k), keptFor(ret)+ttl)
	}
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "r", Owner: "a", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{s.recKey("r"), s.stateKey("r")} {
		within(k+" after the release", pttl(t, srv, k), keptFor(ret))
	}
	// A gate without retention removes the TTL on its next write.
	s0 := openRetention(t, srv.URL(), prefix, 0)
	if _, err := s0.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "b", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{s.recKey("r"), s.stateKey("r")} {
		if got := pttl(t, srv, k); got != -1 {
			t.Fatalf("%s: PTTL %d after a write with retention 0, want -1", k, got)
		}
	}
}

// TestKeptForCoversTheSlack: an admission answered without a script may
// come up to a slack after the last script's check, which may have left
// the TTL a slack short: the TTL the scripts set covers both, so that a
// record stays a whole retention after its last admission, and at most 2 s
// more.
func TestKeptForCoversTheSlack(t *testing.T) {
	for _, ret := range []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 4 * time.Second,
		8 * time.Second, 15 * time.Second, 16 * time.Second, 17 * time.Second, time.Hour, 720 * time.Hour, 720*time.Hour + 3*time.Microsecond} {
		kept := keptFor(ret)
		if left := kept - 2*keepSlack(kept); left < ret.Truncate(time.Millisecond) {
			t.Errorf("retention %v: kept %v, slack %v: an admission may find %v left, less than the retention", ret, kept, keepSlack(kept), left)
		}
		if kept > ret+2*time.Second {
			t.Errorf("retention %v: kept %v, more than 2 s beyond it", ret, kept)
		}
	}
	if keptFor(0) != 0 {
		t.Errorf("retention 0 kept for %v, want 0 (for ever)", keptFor(0))
	}
	// A retention near the longest duration keeps records for as long,
	// not for a wrapped-around negative time (which PERSIST would read as
	// for ever, another retention than the one asked).
	for _, ret := range []time.Duration{math.MaxInt64, math.MaxInt64 - time.Second} {
		if kept := keptFor(ret); kept < ret.Truncate(time.Millisecond) {
			t.Errorf("retention %v kept for %v, less than it", ret, kept)
		}
	}
}

// TestAdmissionKeepsRecord: admissions keep a record whose lease ended,
// through Admit and through AdmitBatch's read of the marks (which leaves a
// record whose TTL no script checked within the slack to admit.lua).
func TestAdmissionKeepsRecord(t *testing.T) {
	srv := valkeytest.Start(t)
	const ret = 4 * time.Second // slack 250 ms
	s := openRetention(t, srv.URL(), freshPrefix(), ret)
	ctx := context.Background()
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "w", Owner: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mustAdmit(t, s, "w", l.Token)
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "w", Owner: "a", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	key := s.recKey("w")
	for i, admit := range []func() error{
		func() error { return admitToken(s, "w", l.Token) },
		func() error {
			errs := make([]error, 1)
			s.AdmitBatch(ctx, []fencing.AdmitRequest{{Resource: "w", Token: l.Token}}, make([]fencing.Admission, 1), errs)
			return errs[0]
		},
	} {
		time.Sleep(time.Second) // past the slack: the TTL is due
		before := pttl(t, srv, key)
		if err := admit(); err != nil {
			t.Fatalf("admission %d: %v", i, err)
		}
		// A PTTL never grows by itself: a higher one was written.
		if after := pttl(t, srv, key); after <= before {
			t.Fatalf("admission %d: PTTL %d ms after, %d before: the record was not kept", i, after, before)
		}
	}
}

// TestRemovedRecordIsNotALoss: a record removed by its retention (here
// deleted, as expiry deletes it) is not taken for a lost store: a token
// issued before is refused as stale, the next acquisition (through this gate
// or another) issues a token above it, and no gate lifts the record or ends
// the new lease.
func TestRemovedRecordIsNotALoss(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	a := openRetention(t, srv.URL(), prefix, time.Hour)
	b := openRetention(t, srv.URL(), prefix, time.Hour)
	ctx := context.Background()
	old := mustAcquire(t, a, "job", "a")
	mustAdmit(t, a, "job", old.Token)
	if _, err := a.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "a", Token: old.Token}); err != nil {
		t.Fatal(err)
	}
	srv.MustDo("DEL", a.recKey("job"), a.stateKey("job"))

	for _, g := range []*Store{a, b} {
		err := admitToken(g, "job", old.Token)
		wantStaleToken(t, err, true, "a token issued before the removal")
		if errors.Is(err, fencing.ErrStoreLost) {
			t.Fatalf("removed record taken for a loss: %v", err)
		}
	}
	if n := srv.MustDo("EXISTS", a.recKey("job")); n != "0" {
		t.Fatal("a refused admission created the record")
	}
	// Re-created through the gate that never saw it.
	next := mustAcquire(t, b, "job", "b")
	if next.Token <= old.Token {
		t.Fatalf("token %d after the removal, want above %d", next.Token, old.Token)
	}
	for _, g := range []*Store{a, b} {
		if err := admitToken(g, "job", next.Token); err != nil {
			t.Fatalf("the new holder's write: %v", err)
		}
		err := admitToken(g, "job", old.Token)
		if !errors.Is(err, fencing.ErrStaleToken) || errors.Is(err, fencing.ErrStoreLost) {
			t.Fatalf("a token from before the removal: %v, want stale", err)
		}
	}
	st, err := a.Status(ctx, "job")
	if err != nil || st.Lease == nil || st.Lease.Token != next.Token {
		t.Fatalf("status %+v, %v: the new lease was ended", st, err)
	}
}

// goneAheadOfTheClock opens two gates a and b with retention on one
// server; gate a admits X, a token issued a minute ahead of the server's
// clock on resource "job", whose record and lease then go (as an expiry
// removes them), while a still remembers X.
func goneAheadOfTheClock(t *testing.T) (a, b *Store, x fencing.Lease) {
	t.Helper()
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	a = openRetention(t, srv.URL(), prefix, time.Hour)
	b = openRetention(t, srv.URL(), prefix, time.Hour)
	x = aheadBy(t, srv, a, "job", "x", time.Minute)
	mustAdmit(t, a, "job", x.Token)
	srv.MustDo("DEL", a.recKey("job"), a.liveKey("job"))
	return a, b, x
}

// TestRecreatedBelowSeenIsLoss: a record re-created below a token this gate
// saw (the server's clock behind it: emulated by a token issued ahead) is
// still a loss, as before retention.
func TestRecreatedBelowSeenIsLoss(t *testing.T) {
	a, b, x := goneAheadOfTheClock(t)
	t1 := mustAcquire(t, b, "job", "t1") // b never saw X: its floor is the clock, below X
	if t1.Token >= x.Token {
		t.Fatalf("t1 %d not below X %d", t1.Token, x.Token)
	}
	err := admitToken(a, "job", x.Token)
	if !errors.Is(err, fencing.ErrStoreLost) || !strings.Contains(err.Error(), "refuses every token up to") {
		t.Fatalf("gate A admitting X on a record re-created below it: %v, want ErrStoreLost and a lift", err)
	}
	wantStaleToken(t, admitToken(b, "job", x.Token), true, "X after the lift")
}

// TestGoneRecordWithClockBehindIsLoss: a record that is gone while a token
// this gate saw on it is ahead of the server's clock is a loss (the clock
// cannot refuse that token): the admission lifts the record past it, so
// that no gate issues a token below it.
func TestGoneRecordWithClockBehindIsLoss(t *testing.T) {
	a, b, x := goneAheadOfTheClock(t)
	if err := admitToken(a, "job", x.Token); !errors.Is(err, fencing.ErrStoreLost) {
		t.Fatalf("X on a gone record, ahead of the clock: %v, want ErrStoreLost", err)
	}
	if n := mustAcquire(t, b, "job", "b"); n.Token <= x.Token {
		t.Fatalf("token %d through a gate that never saw X, want above X %d", n.Token, x.Token)
	}
	wantStaleToken(t, admitToken(b, "job", x.Token), true, "X after the lift")
}

// TestCheckpointStateExpiresWhenTheRecordsTTLIsRight: a checkpoint's SET
// takes the state's TTL away; the script gives it back even when the
// record's TTL is already what the retention wants (a checkpoint in the
// same millisecond as its acquisition: made exact here by a transaction,
// whose commands share one clock on the server).
func TestCheckpointStateExpiresWhenTheRecordsTTLIsRight(t *testing.T) {
	srv := valkeytest.Start(t)
	const ret, ttl = time.Hour, 10 * time.Minute
	s := openRetention(t, srv.URL(), freshPrefix(), ret)
	l, err := s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "c", Owner: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.FormatInt((ret + ttl).Milliseconds(), 10)
	tok := strconv.FormatUint(uint64(l.Token), 10)
	got := srv.MustDoAll([]string{"MULTI"},
		[]string{"PEXPIRE", s.recKey("c"), want},
		append(append([]string{"EVAL", source("checkpoint"), "4"}, s.leaseKeys("c")...),
			"a", tok, `{"n":1}`, strconv.FormatInt(ret.Milliseconds(), 10)),
		[]string{"PTTL", s.stateKey("c")},
		[]string{"EXEC"})
	exec := strings.Split(got[len(got)-1], "\n")
	if n, err := strconv.ParseInt(exec[len(exec)-1], 10, 64); err != nil || n < 0 {
		t.Fatalf("the checkpoint's state after the script: PTTL %q (transaction: %q), want an expiry", exec[len(exec)-1], got)
	}
}

// TestBarrierEntryKeepsRecord: a record with a shared-barrier entry is
// not removed (DESIGN §12): a write registered with a hold longer than
// the retention keeps its record, with its state, at least that long,
// even once its lease has ended.
func TestBarrierEntryKeepsRecord(t *testing.T) {
	srv := valkeytest.Start(t)
	const ret, hold = time.Second, time.Hour
	s := openRetention(t, srv.URL(), freshPrefix(), ret)
	ctx := context.Background()
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "b", Owner: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: "b", Owner: "a", Token: l.Token, State: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	if _, entry, _, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: "b", Token: l.Token}, "gate-1", hold); err != nil || entry.ID == "" {
		t.Fatalf("AdmitRegister: %+v %v", entry, err)
	}
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "b", Owner: "a", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{s.recKey("b"), s.stateKey("b")} {
		if got := pttl(t, srv, k); got < (hold - time.Minute).Milliseconds() {
			t.Fatalf("%s: PTTL %d ms with a barrier entry held for %v, want the record kept that long", k, got, hold)
		}
	}
}
