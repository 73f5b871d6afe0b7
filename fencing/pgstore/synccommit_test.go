package pgstore

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// crashGroup kills the postmaster and every backend at once (SIGKILL to
// the process group pgtest gives the server), as a power loss of the
// server's processes would: WAL still in shared memory is gone. Then it
// starts the server again.
func crashGroup(t *testing.T, c *pgtest.Cluster) {
	t.Helper()
	pid := c.PID()
	if pid == 0 {
		t.Fatal("server not running")
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.Kill() // reaps the postmaster, waits for the backends to go
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
}

// TestSynchronousCommitTurnedOffAfterOpen: Open refuses a session whose
// synchronous_commit is off, and so must every later connection: an
// administrator who turns it off afterwards (ALTER DATABASE/ROLE … SET,
// picked up by the pool's next connection) would otherwise have the store
// acknowledge raises and tokens that a crash of the database loses (a
// high-water mark acknowledged, the write forwarded, comes back lower and
// the superseded token is admitted again). The raise is refused as
// unavailable instead, nothing done; and after a crash the older token is
// still stale.
func TestSynchronousCommitTurnedOffAfterOpen(t *testing.T) {
	c := pgtest.Start(t)
	ctx := context.Background()
	s, err := Open(ctx, Options{URL: c.SocketURL("postgres"), Schema: "fg", StatementTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	const res = "job"
	a, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "a", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The DBA's change, after fencegate started (ALTER DATABASE: the test
	// server has synchronous_commit=on on its command line, which
	// postgresql.conf cannot override). wal_writer_delay only widens the
	// window in which the WAL writer has not written the commit yet.
	for _, sql := range []string{`ALTER DATABASE postgres SET synchronous_commit = off`, `ALTER SYSTEM SET wal_writer_delay = '10s'`,
		`SELECT pg_reload_conf()`} {
		if err := c.Exec("postgres", sql); err != nil {
			t.Fatal(err)
		}
	}
	// The pool's next connections run with it: Reset stands for pgxpool's
	// recycling (pool_max_conn_lifetime, 1 h by default) or any reconnect.
	s.pool.Reset()
	// b's first write would raise the mark: refused, nothing done.
	adm, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: b.Token})
	if !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), "synchronous_commit") {
		t.Fatalf("Admit(b) with synchronous_commit off: %+v %v, want unavailable (synchronous_commit)", adm, err)
	}
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "other", Owner: "x", TTL: time.Minute}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Acquire with synchronous_commit off: %v, want unavailable", err)
	}
	crashGroup(t, c)
	for _, sql := range []string{`ALTER DATABASE postgres RESET synchronous_commit`, `ALTER SYSTEM RESET wal_writer_delay`, `SELECT pg_reload_conf()`} {
		if err := c.Exec("postgres", sql); err != nil {
			t.Fatal(err)
		}
	}
	// a's delayed write arrives: it is stale once b raises the mark.
	if adm, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: b.Token}); err != nil || !adm.Raised {
		t.Fatalf("Admit(b) with synchronous_commit back on: %+v %v", adm, err)
	}
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: a.Token})
	var stale *fencing.StaleTokenError
	if !errors.As(err, &stale) {
		t.Fatalf("a's token %d (superseded by b's %d): err=%v, want stale", a.Token, b.Token, err)
	}
}

// TestSynchronousCommitOffInAnOpenSession: a change that reaches sessions
// already open (ALTER SYSTEM and a reload, a pooler's server session; here
// SET on the pool's one connection) is caught by every write transaction:
// refused as unavailable with nothing written, the shared barrier's
// admissions too; admissions at the mark, which write nothing, still
// pass. A stronger setting than on (remote_apply) is kept.
func TestSynchronousCommitOffInAnOpenSession(t *testing.T) {
	c := pgtest.Need(t, cluster)
	ctx := context.Background()
	s := openURL(t, c.SocketURL("postgres")+"&pool_max_conns=1&synchronous_commit=remote_apply", freshSchema())
	var v string
	if err := s.pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&v); err != nil || v != "remote_apply" {
		t.Fatalf("synchronous_commit %q %v, want the URL's remote_apply", v, err)
	}
	a, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "r", Owner: "a", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		t.Fatal(err)
	}
	before, err := s.Status(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "new", Owner: "x", TTL: time.Minute}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Errorf("Acquire: %v, want unavailable", err)
	}
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "r", Owner: "b", Token: b.Token}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Errorf("Release: %v, want unavailable", err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: b.Token}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Errorf("Admit raising: %v, want unavailable", err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: a.Token}); err != nil {
		t.Errorf("Admit at the mark (a read): %v", err)
	}
	if _, _, _, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: "r", Token: a.Token}, "g", time.Second); !errors.Is(err, fencing.ErrUnavailable) {
		t.Errorf("AdmitRegister at the mark: %v, want unavailable", err)
	}
	if _, _, _, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: "r", Token: b.Token}, "g", time.Second); !errors.Is(err, fencing.ErrUnavailable) {
		t.Errorf("AdmitRegister raising: %v, want unavailable", err)
	}
	after, err := s.Status(ctx, "r")
	if err != nil || after.Issued != before.Issued || after.HighWater != a.Token || after.Lease == nil || after.Lease.Token != b.Token {
		t.Errorf("status after the refusals: %+v %v, was %+v", after, err, before)
	}
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.schema+`.barrier`).Scan(&n); err != nil || n != 0 {
		t.Errorf("barrier entries left: %d %v", n, err)
	}
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "new", Owner: "x", TTL: time.Minute}); err == nil {
		t.Errorf("the resource refused was created")
	}
	if _, err := s.pool.Exec(ctx, `RESET synchronous_commit`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "new", Owner: "x", TTL: time.Minute}); err != nil {
		t.Errorf("Acquire with synchronous_commit back: %v", err)
	}
}
