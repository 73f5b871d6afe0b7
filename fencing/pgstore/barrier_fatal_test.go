package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// TestAdmitRegisterTerminated: the server process of a write's batch is
// terminated (pg_terminate_backend, SQLSTATE 57P01 admin_shutdown) at two
// moments, and the write must leave exactly the entries the gate knows of.
//
//   - Before the commit, while the batch waits for the record's row lock:
//     the server rolls the batch back and says so (FATAL 57P01). The store
//     tries again on a new connection: the write is admitted with one
//     entry, and its removal leaves none.
//   - After the commit, while it waits for a synchronous standby (an
//     everyday case with synchronous replication, during a failover or an
//     administrator's termination): the transaction is committed locally,
//     the server only warns and closes the connection. The store must not
//     take this for a failure that changed nothing and register the write a
//     second time on a new connection (the gate would forward and remove
//     the second entry; the first would stay until its deadline, holding
//     the next holder's writes): the write is ambiguous, with its one entry.
//
// Both in each query mode a URL may choose (pgx reports a lost connection
// differently in each).
func TestAdmitRegisterTerminated(t *testing.T) {
	c := pgtest.Need(t, cluster)
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) { admitRegisterTerminated(t, c, mode) })
	}
}

func admitRegisterTerminated(t *testing.T, c *pgtest.Cluster, mode string) {
	ctx := context.Background()
	schema := freshSchema()
	s := openURL(t, c.SocketURL("postgres")+"&default_query_exec_mode="+mode, schema)
	// The test's own statements do not wait for a standby.
	admin := openURL(t, c.SocketURL("postgres")+"&synchronous_commit=local", schema)
	const res = "terminated"
	a := newHolder(t, admin, res, "a")
	e, _ := registerEntry(t, s, res, "g", a, time.Minute) // the next writes are at the mark: one batch each
	if err := s.Leave(ctx, e); err != nil {
		t.Fatal(err)
	}
	standby := func(names string) {
		t.Helper()
		for _, sql := range []string{`ALTER SYSTEM SET synchronous_standby_names = '` + names + `'`, `SELECT pg_reload_conf()`} {
			if err := c.Exec("postgres", sql); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() { standby("") })

	type result struct {
		e   fencing.BarrierEntry
		err error
	}
	// terminate starts a write at the mark, terminates its server process
	// once it waits (wait: its wait_event_type or wait_event), calls then, and returns the write's
	// outcome, and false if the write ended without waiting (nothing
	// terminated, then not called).
	terminate := func(wait string, then func()) (result, bool) {
		t.Helper()
		done := make(chan result, 1)
		go func() {
			_, e, _, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: a}, "g", time.Minute)
			done <- result{e, err}
		}()
		var pid int
		for give := time.Now().Add(30 * time.Second); ; {
			select {
			case r := <-done:
				return r, false
			default:
			}
			if err := admin.pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
				WHERE $1 IN (wait_event_type, wait_event) AND pid <> pg_backend_pid()`, wait).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			if pid != 0 {
				break
			}
			if time.Now().After(give) {
				t.Fatalf("the write never waited for %s", wait)
			}
			time.Sleep(5 * time.Millisecond)
		}
		var ok bool
		if err := admin.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
		}
		then()
		return <-done, true
	}

	// Before the commit: the row is locked by a transaction of the test.
	tx, err := admin.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+schema+`.resources WHERE resource = $1 FOR UPDATE`, res); err != nil {
		t.Fatal(err)
	}
	r, waited := terminate("Lock", func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if !waited {
		t.Fatalf("a write at the mark went through a row the test holds locked: %+v", r)
	}
	if r.err != nil {
		t.Fatalf("a write whose batch was rolled back by a terminated server process: %v, want it admitted on a new connection", r.err)
	}
	if err := s.Leave(ctx, r.e); err != nil {
		t.Fatal(err)
	}
	if n := barrierRows(t, admin, res); n != 0 {
		t.Fatalf("a write terminated before its commit, tried again and removed: %d entries stay", n)
	}

	// After the commit: commits wait for a standby that never comes. The
	// server's backends take the setting when they get to the reload
	// pg_reload_conf signals, not at once: a write that commits before its
	// backend has it does not wait, and is tried again once its entry is
	// removed.
	standby("fencegate_no_such_standby")
	for try := 1; ; try++ {
		if r, waited = terminate("SyncRep", func() { standby("") }); waited {
			break
		}
		if r.err != nil {
			t.Fatalf("a write at the mark, before the commits waited for a standby: %v", r.err)
		}
		if err := s.Leave(ctx, r.e); err != nil {
			t.Fatal(err)
		}
		if try == 50 {
			t.Fatal("50 writes committed without waiting for the standby the server was told to wait for")
		}
		time.Sleep(20 * time.Millisecond)
	}
	n := barrierRows(t, admin, res)
	if r.err == nil {
		if err := s.Leave(ctx, r.e); err != nil {
			t.Fatal(err)
		}
		t.Fatalf("a write terminated after its commit was admitted (registered again on a new connection): after its removal %d entries stay, "+
			"holding the next holder's writes until their deadline", barrierRows(t, admin, res))
	}
	if !errors.Is(r.err, fencing.ErrAmbiguous) || n != 1 {
		t.Fatalf("a write terminated after its commit: %v with %d entries, want ErrAmbiguous with its one entry", r.err, n)
	}
}
