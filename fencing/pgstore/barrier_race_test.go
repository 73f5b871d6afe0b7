package pgstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// openURL opens a store on url (a URL of the test cluster with extra
// settings) over schema.
func openURL(t testing.TB, url, schema string) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{URL: url, Schema: schema, StatementTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	mutate(s)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSharedBarrierRunsReadCommitted: a database whose default isolation
// is REPEATABLE READ (an administrator's ALTER DATABASE … SET) must not
// change what the barrier sees. A write at the mark holds the row's shared
// lock and registers; the next holder's raise waits for that lock, and its
// registration, a later statement, must count the entry committed
// meanwhile. Under one snapshot taken before the wait it would not, and
// the raising write would be forwarded while the lower one is in flight.
// A URL that asks for another level is refused at start-up.
func TestSharedBarrierRunsReadCommitted(t *testing.T) {
	c := pgtest.Need(t, cluster)
	ctx := context.Background()
	const db = "fg_repeatable_read"
	for _, sql := range []string{`DROP DATABASE IF EXISTS ` + db, `CREATE DATABASE ` + db} {
		if err := c.Exec("postgres", sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Exec("postgres", `ALTER DATABASE `+db+` SET default_transaction_isolation = 'repeatable read'`); err != nil {
		t.Fatal(err)
	}
	schema := freshSchema()
	g := openURL(t, c.SocketURL(db), schema)
	m := openURL(t, c.SocketURL(db), schema)
	const res = "iso"
	a := newHolder(t, g, res, "a")
	ea, _ := registerEntry(t, g, res, "g", a, time.Minute)
	if err := g.Leave(ctx, ea); err != nil {
		t.Fatal(err)
	}
	b := newHolder(t, g, res, "b")

	// A write at the mark a, stopped between its locked read and its
	// commit.
	tx, err := m.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.rollback(ctx, tx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+schema+`.resources WHERE resource = $1 FOR SHARE`, res); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.barrier (resource, token, gate, deadline)
		VALUES ($1, $2, 'g', clock_timestamp() + interval '1 minute')`, res, int64(a)); err != nil {
		t.Fatal(err)
	}
	type result struct {
		lower bool
		err   error
	}
	done := make(chan result, 1)
	go func() {
		_, _, lower, err := g.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: b}, "g", time.Minute)
		done <- result{lower, err}
	}()
	for give := time.Now().Add(30 * time.Second); ; {
		var waiting int
		if err := m.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`, db).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(give) {
			t.Fatal("the raise never waited for the row's lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("the raise to %d: %v", b, r.err)
	}
	if !r.lower {
		t.Fatalf("the raise to %d counted no lower entry, although the write at %d registered before it: it would be forwarded while that write is in flight", b, a)
	}

	for _, level := range []string{"repeatable%20read", "serializable"} {
		_, err := Open(ctx, Options{URL: c.SocketURL("postgres") + "&default_transaction_isolation=" + level, Schema: freshSchema()})
		if err == nil || !strings.Contains(err.Error(), "read committed") {
			t.Errorf("Open with default_transaction_isolation=%s: %v, want a refusal naming read committed", level, err)
		}
	}
}

// TestDoomedWritesAtTheMarkRegisterNothing: while a holder's lease has
// ended and the next holder writes for the first time, many gates keep
// sending writes with the old token under a strict rule. They are at the
// mark but refused (lease-not-held), so they must register nothing: the
// next holder's raise must find no lower entry to wait for. Were they to
// register and then leave, the raise would count them (it waits for every
// admission in flight at the old mark), and one whose removal failed (its
// client gone) would hold the holder's writes until its deadline.
func TestDoomedWritesAtTheMarkRegisterNothing(t *testing.T) {
	ctx := context.Background()
	schema := freshSchema()
	gs := []*Store{open(t, schema), open(t, schema), open(t, schema)}
	const res = "doomed"
	for round := 0; round < 10; round++ {
		a := newHolder(t, gs[0], res, "a")
		ea, _ := registerEntry(t, gs[0], res, "g", a, time.Minute)
		if err := gs[0].Leave(ctx, ea); err != nil {
			t.Fatal(err)
		}
		b := newHolder(t, gs[0], res, "b") // a's lease is released: strict writes with a are doomed
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var doomed atomic.Int64
		for i := range 16 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _, _, err := gs[i%2].AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: a, RequireLive: true}, "flood", time.Minute)
					if errors.Is(err, fencing.ErrStaleToken) {
						return // the raise went through
					}
					if !errors.Is(err, fencing.ErrLeaseNotHeld) {
						t.Errorf("a write with the ended lease's token: %v, want ErrLeaseNotHeld", err)
						return
					}
					doomed.Add(1)
				}
			})
		}
		for doomed.Load() == 0 && !t.Failed() {
			time.Sleep(time.Millisecond)
		}
		_, eb, lower, err := gs[2].AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: b, RequireLive: true}, "holder", time.Minute)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("round %d: the holder's first write: %v", round, err)
		}
		if lower {
			t.Fatalf("round %d: the holder's first write found a lower entry to wait for, with only refused writes at the old mark (%d of them)", round, doomed.Load())
		}
		if err := gs[2].Leave(ctx, eb); err != nil {
			t.Fatal(err)
		}
		if n := barrierRows(t, gs[0], res); n != 0 {
			t.Fatalf("round %d: %d entries left behind", round, n)
		}
	}
}
