package record_test

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func enc(t *testing.T, r *record.Record) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestJSONFormat pins the persisted form: the file store keeps records in
// this encoding, so a change here is a file format change.
func TestJSONFormat(t *testing.T) {
	var r record.Record
	l, err := r.Acquire(fencing.AcquireRequest{Resource: "job:1", Owner: "alice", TTL: 30 * time.Second}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Checkpoint(fencing.CheckpointRequest{Resource: "job:1", Owner: "alice", Token: l.Token, State: []byte(`{"a":1}`)}, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Admit(fencing.AdmitRequest{Resource: "job:1", Token: 1}, t0); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Release(fencing.ReleaseRequest{Resource: "job:1", Owner: "alice", Token: 1, Finished: true}, t0.Add(2*time.Second)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := r.Acquire(fencing.AcquireRequest{Resource: "job:1", Owner: "bob", TTL: time.Minute}, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	ms := t0.UnixMilli()
	want := `{"issued":2,"high_water":1,` +
		`"last":{"owner":"bob","token":2,"ttl_ms":60000,"acquired_ms":` + itoa(ms+3000) + `,"expires_ms":` + itoa(ms+63000) + `},` +
		`"prior":{"owner":"alice","token":1,"ended":"released","finished":true},` +
		`"checkpoint":{"token":1,"updated_ms":` + itoa(ms+1000) + `,"size_bytes":7},"touched_ms":` + itoa(ms+3000) + `}`
	if got := enc(t, &r); got != want {
		t.Fatalf("encoding\n got %s\nwant %s", got, want)
	}
	var back record.Record
	if err := json.Unmarshal([]byte(want), &back); err != nil {
		t.Fatal(err)
	}
	if got := enc(t, &back); got != want {
		t.Fatalf("round trip\n got %s\nwant %s", got, want)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestRefusalsChangeNothing runs every refusal on a record with history and
// checks the record is byte-for-byte the same afterwards: the stores rely on
// it (memstore applies every operation to the stored record in place).
func TestRefusalsChangeNothing(t *testing.T) {
	const res = "job:1"
	var r record.Record
	a, _ := r.Acquire(fencing.AcquireRequest{Resource: res, Owner: "alice", TTL: time.Minute}, t0)
	r.Release(fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: a.Token}, t0)
	b, _ := r.Acquire(fencing.AcquireRequest{Resource: res, Owner: "bob", TTL: time.Minute}, t0)
	r.Admit(fencing.AdmitRequest{Resource: res, Token: b.Token}, t0)
	now := t0.Add(time.Second)
	before := enc(t, &r)
	refusals := []struct {
		name string
		err  error
		want error
	}{
		{"acquire held", second(r.Acquire(fencing.AcquireRequest{Resource: res, Owner: "carol", TTL: time.Minute}, now)), fencing.ErrLeaseHeld},
		{"renew other owner", second(r.Renew(fencing.RenewRequest{Resource: res, Owner: "alice", Token: b.Token}, now)), fencing.ErrLeaseLost},
		{"renew old token", second(r.Renew(fencing.RenewRequest{Resource: res, Owner: "bob", Token: a.Token}, now)), fencing.ErrLeaseLost},
		{"renew with TTL, other owner", second(r.Renew(fencing.RenewRequest{Resource: res, Owner: "alice", Token: b.Token, TTL: time.Hour}, now)), fencing.ErrLeaseLost},
		{"renew after expiry", second(r.Renew(fencing.RenewRequest{Resource: res, Owner: "bob", Token: b.Token}, t0.Add(time.Hour))), fencing.ErrLeaseLost},
		{"release old", second(r.Release(fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: a.Token}, now)), fencing.ErrLeaseLost},
		{"checkpoint forged", second(r.Checkpoint(fencing.CheckpointRequest{Resource: res, Owner: "bob", Token: 99, State: []byte(`1`)}, now)), fencing.ErrLeaseLost},
		{"admit stale", second(r.Admit(fencing.AdmitRequest{Resource: res, Token: a.Token}, now)), fencing.ErrStaleToken},
		{"admit not issued", second(r.Admit(fencing.AdmitRequest{Resource: res, Token: b.Token + 1}, now)), fencing.ErrTokenNotIssued},
		{"strict admit after expiry", second(r.Admit(fencing.AdmitRequest{Resource: res, Token: b.Token, RequireLive: true}, t0.Add(time.Hour))), fencing.ErrLeaseNotHeld},
		{"read no checkpoint", second(r.ReadCheckpoint(nil, now)), fencing.ErrNoCheckpoint},
	}
	for _, c := range refusals {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if after := enc(t, &r); after != before {
		t.Fatalf("refusals changed the record\nbefore %s\n after %s", before, after)
	}
	// Strict admission of the live token passes without a raise.
	adm, err := r.Admit(fencing.AdmitRequest{Resource: res, Token: b.Token, RequireLive: true}, now)
	if err != nil || adm.Raised {
		t.Fatalf("strict admission of the live token = %+v, %v", adm, err)
	}
	if after := enc(t, &r); after != before {
		t.Fatalf("an admission at the mark changed the record\nbefore %s\n after %s", before, after)
	}
}

func second[T any](_ T, err error) error { return err }

func TestReleaseOutcomes(t *testing.T) {
	const res = "job:1"
	rel := func(r *record.Record, owner string, tok fencing.Token, at time.Time) (bool, error) {
		return r.Release(fencing.ReleaseRequest{Resource: res, Owner: owner, Token: tok}, at)
	}
	var r record.Record
	a, _ := r.Acquire(fencing.AcquireRequest{Resource: res, Owner: "alice", TTL: time.Minute}, t0)
	// Expired, nothing newer: false, and the ending stays "expired".
	late := t0.Add(2 * time.Minute)
	if ok, err := rel(&r, "alice", a.Token, late); ok || err != nil {
		t.Fatalf("release after expiry = %v, %v; want false, nil", ok, err)
	}
	if p := r.Status(res, late).Previous; p == nil || p.Ended != fencing.EndExpired {
		t.Fatalf("previous after releasing an expired lease %+v, want expired", p)
	}
	// Same token, other owner: lost.
	if _, err := rel(&r, "bob", a.Token, late); !errors.Is(err, fencing.ErrLeaseLost) {
		t.Fatalf("release by another owner: %v", err)
	}
	// Once a newer token exists: lost.
	r.Acquire(fencing.AcquireRequest{Resource: res, Owner: "bob", TTL: time.Minute}, late)
	if _, err := rel(&r, "alice", a.Token, late); !errors.Is(err, fencing.ErrLeaseLost) {
		t.Fatalf("release of an old token: %v", err)
	}
}

func TestExpiryBoundary(t *testing.T) {
	var r record.Record
	l, _ := r.Acquire(fencing.AcquireRequest{Resource: "r", Owner: "alice", TTL: time.Second}, t0)
	if _, ok := r.Live("r", l.ExpiresAt.Add(-time.Millisecond)); !ok {
		t.Fatal("not live 1 ms before expires_at")
	}
	if _, ok := r.Live("r", l.ExpiresAt); ok {
		t.Fatal("still live at expires_at")
	}
	if st := r.Status("r", l.ExpiresAt); st.Lease != nil || st.Previous == nil || st.Previous.Ended != fencing.EndExpired {
		t.Fatalf("status at expires_at %+v", st)
	}
}

// TestAcquireAtClock: tokens follow the clock, a fresh record refuses what
// predates it, and Absent refuses old tokens of a missing record as stale.
func TestAcquireAtClock(t *testing.T) {
	var r record.Record
	clock := record.ClockMicros(t0)
	l, err := r.AcquireAt(fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Minute}, t0, clock)
	if err != nil || l.Token != clock || r.Floor != clock-1 || r.HighWater != 0 {
		t.Fatalf("first lease %+v, %v; record %+v", l, err, r)
	}
	if _, err := r.Admit(fencing.AdmitRequest{Resource: "r", Token: clock - 1}, t0); !errors.Is(err, fencing.ErrStaleToken) {
		t.Fatalf("token below the fresh record's clock: %v", err)
	}
	if ok, err := r.Release(fencing.ReleaseRequest{Resource: "r", Owner: "a", Token: l.Token}, t0); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// The clock behind issued: issued+1.
	l2, err := r.AcquireAt(fencing.AcquireRequest{Resource: "r", Owner: "b", TTL: time.Minute}, t0, clock-5)
	if err != nil || l2.Token != clock+1 || r.Floor != clock-1 {
		t.Fatalf("second lease %+v, %v; record %+v", l2, err, r)
	}
	var stale *fencing.StaleTokenError
	if err := record.Absent(fencing.AdmitRequest{Resource: "r", Token: 7}, clock); !errors.As(err, &stale) || stale.HighWater != clock {
		t.Fatalf("Absent below the clock: %v", err)
	}
	if err := record.Absent(fencing.AdmitRequest{Resource: "r", Token: clock}, clock); !errors.Is(err, fencing.ErrTokenNotIssued) {
		t.Fatalf("Absent at the clock: %v", err)
	}
	if err := record.Absent(fencing.AdmitRequest{Resource: "r", Token: 1}, 0); !errors.Is(err, fencing.ErrTokenNotIssued) {
		t.Fatalf("Absent counting from one: %v", err)
	}
}

// TestIdle: retention removes only an ended lease's record untouched for
// the retention and its slack; a stale touch is one older than the slack.
func TestIdle(t *testing.T) {
	var r record.Record
	l, _ := r.AcquireAt(fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: 2 * time.Hour}, t0, 0)
	if r.Idle(t0.Add(90*time.Minute), time.Hour) {
		t.Fatal("a live lease's record is idle")
	}
	r.Release(fencing.ReleaseRequest{Resource: "r", Owner: "a", Token: l.Token}, t0.Add(time.Minute))
	// Released at 1 min; an hour's retention, 7.5 min of slack.
	if r.Idle(t0.Add(68*time.Minute), time.Hour) || !r.Idle(t0.Add(69*time.Minute), time.Hour) || r.Idle(t0.Add(100*time.Hour), 0) {
		t.Fatal("idleness not measured from the release")
	}
	if r.TouchStale(t0.Add(8*time.Minute), time.Hour) || !r.TouchStale(t0.Add(9*time.Minute), time.Hour) {
		t.Fatal("stale touch not at the slack, an eighth of the retention")
	}
	r.Touch(t0.Add(2 * time.Hour))
	if r.Idle(t0.Add(150*time.Minute), time.Hour) {
		t.Fatal("a touched record is idle")
	}
}

// TestIdleUnderACenturiesLongRetention: a retention whose slack takes it
// past the longest duration (FENCEGATE_RETENTION accepts up to about
// 2,562,047h) keeps a released record, as long as it says, instead of
// wrapping to a negative age that removes it at the next sweep.
func TestIdleUnderACenturiesLongRetention(t *testing.T) {
	for _, retention := range []time.Duration{2300000 * time.Hour, math.MaxInt64 - time.Second, math.MaxInt64} {
		var r record.Record
		l, _ := r.AcquireAt(fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Second}, t0, 0)
		r.Release(fencing.ReleaseRequest{Resource: "r", Owner: "a", Token: l.Token}, t0)
		if r.Idle(t0.Add(time.Second), retention) || r.Idle(t0.Add(100*365*24*time.Hour), retention) {
			t.Errorf("retention %v: a record released at t0 is idle within a century", retention)
		}
		if k := record.Kept(retention); k < retention {
			t.Errorf("Kept(%v) = %v, less than the retention", retention, k)
		}
	}
}

// TestIdleKeepsUnwrittenAdmissions: a store that writes an admission at the
// mark only when the record's touch is stale leaves some admissions
// unwritten; whichever it left, the record stays idle-free for a whole
// retention after that admission (DESIGN §12: an admitted write is a
// touch).
func TestIdleKeepsUnwrittenAdmissions(t *testing.T) {
	for _, retention := range []time.Duration{time.Second, time.Hour, 720 * time.Hour} {
		var r record.Record
		l, _ := r.AcquireAt(fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Second}, t0, 0)
		r.Release(fencing.ReleaseRequest{Resource: "r", Owner: "a", Token: l.Token}, t0)
		step := max(retention/64, time.Millisecond)
		unwritten := 0
		for at := t0; at.Before(t0.Add(3 * retention)); at = at.Add(step) {
			if r.TouchStale(at, retention) {
				r.Touch(at) // the store writes this admission
				continue
			}
			unwritten++
			if r.Idle(at.Add(retention-time.Millisecond), retention) {
				t.Fatalf("retention %v: an admission at +%v, left unwritten, is idle %v later", retention, at.Sub(t0), retention-time.Millisecond)
			}
		}
		if unwritten == 0 {
			t.Fatalf("retention %v: every admission written, nothing checked", retention)
		}
	}
}
