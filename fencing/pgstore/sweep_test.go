package pgstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/fencing"
)

// TestSweepKeepsARecordRegisteredMeanwhile: a shared-barrier admission
// that registers its entry while a sweep pass runs (after the pass read
// the barrier table, before it locked the record) keeps the record: the
// sweep removes no record that has a barrier entry when it removes it
// (DESIGN §12), whatever its statement saw of the table when it began.
//
// Thousands of decoy records, idle but each with a barrier entry, make the
// pass's scan long enough for the admission to commit inside it; the
// admission is the first batch of AdmitRegister as sent (admitBatch), so
// that no touch follows it to mask the removal. A pass that starts after
// the admission sees its entry, one that locks the record first makes the
// admission wait and then refuse: only a removal with the entry in place
// fails the test.
func TestSweepKeepsARecordRegisteredMeanwhile(t *testing.T) {
	s := openWith(t, freshSchema(), time.Second)
	ctx := context.Background()
	q := pgx.Identifier{s.schema}.Sanitize()
	res := q + ".resources"
	const decoys = 20000
	for _, sql := range []string{
		`INSERT INTO ` + res + ` (resource, issued, high_water, touched_at)
			SELECT 'decoy:' || i, 1, 1, clock_timestamp() - interval '2 hours' FROM generate_series(1, ` + strconv.Itoa(decoys) + `) i`,
		`INSERT INTO ` + q + ".barrier" + ` (resource, token, gate, deadline)
			SELECT 'decoy:' || i, 1, 'elsewhere', clock_timestamp() + interval '1 hour' FROM generate_series(1, ` + strconv.Itoa(decoys) + `) i`,
		`ANALYZE ` + res,
	} {
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	const target = "job:target"
	// idle gives the target a record last used an hour ago, its mark at
	// its one token, and returns the token.
	idle := func() fencing.Token {
		t.Helper()
		l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: target, Owner: "w", TTL: time.Minute})
		if err == nil {
			_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: target, Token: l.Token})
		}
		if err == nil {
			_, err = s.Release(ctx, fencing.ReleaseRequest{Resource: target, Owner: "w", Token: l.Token})
		}
		if err == nil {
			_, err = s.pool.Exec(ctx, `UPDATE `+res+` SET touched_at = touched_at - interval '1 hour',
				acquired_at = acquired_at - interval '1 hour', expires_at = expires_at - interval '1 hour' WHERE resource = $1`, target)
		}
		if err != nil {
			t.Fatal(err)
		}
		return l.Token
	}
	// How long a pass takes that removes nothing (the target not yet
	// idle): the admission is placed inside such a pass.
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: target, Owner: "w", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if n, err := s.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("Sweep = %d, %v; want nothing removed", n, err)
	}
	pass := time.Since(start)
	if _, err := s.pool.Exec(ctx, `UPDATE `+res+` SET expires_at = clock_timestamp() WHERE resource = $1`, target); err != nil {
		t.Fatal(err)
	}

	inside := 0
	for i := 1; i <= 8; i++ {
		token := idle()
		swept := make(chan error, 1)
		go func() {
			_, err := s.Sweep(ctx)
			swept <- err
		}()
		time.Sleep(pass * time.Duration(i) / 10)
		b, err := s.admitBatch(ctx, fencing.AdmitRequest{Resource: target, Token: token}, "gate-a", time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-swept; err != nil {
			t.Fatal(err)
		}
		if b.id == nil {
			continue // the pass locked the record first: the admission found it gone
		}
		inside++
		st, err := s.Status(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		if st.Issued == 0 {
			t.Fatalf("attempt %d: the sweep removed %s while the write admitted at token %d holds a barrier entry (registered %d%% into a pass of %v)",
				i, target, token, i*10, pass)
		}
		if err := s.Leave(ctx, fencing.BarrierEntry{Resource: target, Token: token, ID: "gate-a:" + strconv.FormatInt(*b.id, 10)}); err != nil {
			t.Fatal(err)
		}
		// The record kept: make it idle again, with a new token.
		if _, err := s.pool.Exec(ctx, `UPDATE `+res+` SET touched_at = touched_at - interval '1 hour' WHERE resource = $1`, target); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d of 8 admissions registered during or before a pass of %v", inside, pass)
}

// TestSweepLeavesTheSlackOfUnwrittenAdmissions: an admission at the mark
// goes unwritten for an eighth of the retention after the record's last
// touch (record.TouchSlack), so the sweep removes a record only once its
// last touch is the retention and that eighth old, on the database's
// clock: a record used 61 minutes ago (retention 1 h) stays, one used 69
// minutes ago goes.
func TestSweepLeavesTheSlackOfUnwrittenAdmissions(t *testing.T) {
	s := openWith(t, freshSchema(), time.Hour)
	ctx := context.Background()
	res := pgx.Identifier{s.schema}.Sanitize() + ".resources"
	const target = "job:slack"
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: target, Owner: "w", TTL: time.Minute})
	if err == nil {
		_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: target, Token: l.Token})
	}
	if err == nil {
		_, err = s.Release(ctx, fencing.ReleaseRequest{Resource: target, Owner: "w", Token: l.Token})
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		back    string
		removed int
	}{{"61 minutes", 0}, {"8 minutes", 1}} {
		if _, err := s.pool.Exec(ctx, `UPDATE `+res+` SET touched_at = touched_at - $2::interval,
			acquired_at = acquired_at - $2::interval, expires_at = expires_at - $2::interval WHERE resource = $1`, target, c.back); err != nil {
			t.Fatal(err)
		}
		n, err := s.Sweep(ctx)
		if err != nil || n != c.removed {
			t.Fatalf("sweep after moving the record's times back %s more: removed %d (%v), want %d", c.back, n, err, c.removed)
		}
	}
	if st, err := s.Status(ctx, target); err != nil || st.Issued != 0 {
		t.Fatalf("status after the removal: %+v, %v; want a resource never used", st, err)
	}
}

// TestSweepUnderACenturiesLongRetention: a retention whose slack takes it
// past the longest duration keeps a record released just now, with its
// checkpoint: the interval the sweep sends is saturated, not wrapped to a
// negative one that makes every ended lease's record idle.
func TestSweepUnderACenturiesLongRetention(t *testing.T) {
	ctx := context.Background()
	ret := 2300000 * time.Hour
	s := openWith(t, freshSchema(), ret)
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: "r", Owner: "a", Token: l.Token, State: []byte(`{"step":7}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "r", Owner: "a", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("Sweep with retention %v just after the release: removed %d (%v), want 0", ret, n, err)
	}
	if _, err := s.ReadCheckpoint(ctx, "r"); err != nil {
		t.Fatalf("checkpoint gone just after the release with retention %v: %v", ret, err)
	}
}
