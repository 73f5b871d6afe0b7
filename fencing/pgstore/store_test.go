package pgstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// cluster is the package's one PostgreSQL server (nil: not installed).
var cluster *pgtest.Cluster

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &cluster)) }

var schemaSeq atomic.Int64

// freshSchema gives every opened store its own schema on the shared server.
func freshSchema() string { return fmt.Sprintf("fgtest_%d", schemaSeq.Add(1)) }

func open(t testing.TB, schema string) *Store {
	t.Helper()
	return openWith(t, schema, 0)
}

// openWith opens a store with a retention (0: none); its background sweep
// stays out of the way (an hour between passes): tests sweep themselves.
func openWith(t testing.TB, schema string, retention time.Duration) *Store {
	t.Helper()
	c := pgtest.Need(t, cluster)
	s, err := Open(context.Background(), Options{URL: c.SocketURL("postgres"), Schema: schema, StatementTimeout: 5 * time.Second,
		Retention: retention, SweepInterval: time.Hour})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	mutate(s)
	t.Cleanup(func() { s.Close() })
	return s
}

// mutate applies the mutant named by FENCEGATE_PG_MUTANT, to show that the
// conformance suite catches it (run by hand; the suite must then fail):
//
//	nolock    the write path reads the row without FOR UPDATE
//	noexpiry  the write path's clock is frozen at the epoch: no lease expires
//	noshare   the shared barrier's admissions at the mark lock nothing
//	nonotify  the shared barrier's Leave notifies nobody
func mutate(s *Store) {
	switch os.Getenv("FENCEGATE_PG_MUTANT") {
	case "noshare":
		s.sql.readShared = strings.Replace(s.sql.readShared, "FOR SHARE", "", 1)
	case "nonotify":
		s.sql.leave = strings.Replace(s.sql.leave, "pg_catalog.pg_notify('"+barrierChannel+"', $3::text)", "$3::text", 1)
	case "nolock":
		s.sql.readLocked = strings.Replace(s.sql.readLocked, "FOR UPDATE", "", 1)
	case "noexpiry":
		s.sql.readLocked = strings.Replace(s.sql.readLocked, nowMicros, "0::bigint", 1)
		s.sql.read = strings.Replace(s.sql.read, nowMicros, "0::bigint", 1)
		s.sql.list = strings.Replace(s.sql.list, "expires_at > pg_catalog.clock_timestamp()", "true", 1)
	}
}

// harness opens stores in fresh schemas on the shared cluster; Reopen opens
// a new pool over the same schema. The database's clock is not injectable:
// Advance stays nil and the suite sleeps past 1 s leases, as it does for
// Valkey, whose server clock is not either.
func harness() fencingtest.Harness {
	return fencingtest.Harness{Open: func(t testing.TB) fencingtest.Instance {
		schema := freshSchema()
		s := openWith(t, schema, testRetention)
		return fencingtest.Instance{Store: s, Reopen: func(t testing.TB) fencing.Store {
			s.Close()
			s = openWith(t, schema, testRetention)
			return s
		}, ClockTokens: true, Retention: testRetention, Sweep: func(ctx context.Context) (int, error) { return s.Sweep(ctx) },
			Delete: func(t testing.TB, res string) {
				t.Helper()
				// As the retention's sweep removes an idle record.
				_, err := s.pool.Exec(context.Background(), `WITH cp AS (DELETE FROM `+schema+`.checkpoints WHERE resource = $1)
					DELETE FROM `+schema+`.resources WHERE resource = $1`, res)
				if err != nil {
					t.Fatalf("deleting %s: %v", res, err)
				}
			}}
	}}
}

// testRetention is the conformance stores' retention, on the database's
// real clock: short, so the retention case sleeps little.
const testRetention = time.Second

func TestConformance(t *testing.T) {
	pgtest.Need(t, cluster)
	fencingtest.Run(t, harness())
}

// TestMigrateConcurrentAndIdempotent starts many stores on one new schema
// at once, then again: the schema is created once, at the newest version.
func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	c := pgtest.Need(t, cluster)
	schema := freshSchema()
	for round := range 2 {
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := Open(context.Background(), Options{URL: c.URL("postgres"), Schema: schema})
				if err == nil {
					s.Close()
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, opener %d: %v", round, i, err)
			}
		}
	}
	s := open(t, schema)
	var n, v int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*), max(version) FROM `+schema+`.schema_version`).Scan(&n, &v); err != nil {
		t.Fatal(err)
	}
	if n != len(migrations) || v != len(migrations) {
		t.Fatalf("schema_version has %d rows up to %d, want %d", n, v, len(migrations))
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	c := pgtest.Need(t, cluster)
	schema := freshSchema()
	open(t, schema)
	if err := c.Exec("postgres", fmt.Sprintf(`INSERT INTO %s.schema_version (version) VALUES (%d)`, schema, len(migrations)+1)); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), Options{URL: c.URL("postgres"), Schema: schema})
	if err == nil || errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), "upgrade fencegate") {
		t.Fatalf("Open on a schema from a newer fencegate: %v", err)
	}
}

func TestOpenRefusesSynchronousCommitOff(t *testing.T) {
	c := pgtest.Need(t, cluster)
	_, err := Open(context.Background(), Options{URL: c.URL("postgres") + "&synchronous_commit=off", Schema: freshSchema()})
	if err == nil || !strings.Contains(err.Error(), "synchronous_commit") {
		t.Fatalf("Open with synchronous_commit=off: %v, want a refusal", err)
	}
}

func TestOpenOptions(t *testing.T) {
	for _, o := range []Options{
		{URL: "http://127.0.0.1:1/db"},
		{URL: "valkey://127.0.0.1:1"},
		{URL: "postgres://127.0.0.1:1/db?pool_max_conns=zero"},
		{URL: "postgres://127.0.0.1:1/db", Schema: "Bad-Schema"},
		{URL: "postgres://127.0.0.1:1/db", Schema: "1abc"},
		{URL: "postgres://127.0.0.1:1/db", MaxCheckpointBytes: -1},
		{URL: "postgres://127.0.0.1:1/db", StatementTimeout: -time.Second},
	} {
		if _, err := Open(context.Background(), o); err == nil || errors.Is(err, fencing.ErrUnavailable) {
			t.Errorf("Open(%+v): %v, want a configuration error", o, err)
		}
	}
	_, err := Open(context.Background(), Options{URL: "postgres://u:s3cret@127.0.0.1:1/db?pool_max_conns=zero"})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("a bad URL with a password: %v", err)
	}
}

func TestOpenUnreachableIsUnavailable(t *testing.T) {
	_, err := Open(context.Background(), Options{URL: "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=1&sslmode=disable"})
	if !errors.Is(err, fencing.ErrUnavailable) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Open on a closed port: %v, want ErrUnavailable without the password", err)
	}
}

// TestPasswordOption: a URL without a password uses Options.Password, and
// a wrong password is refused without leaking it.
func TestPasswordOption(t *testing.T) {
	c := pgtest.Need(t, cluster)
	s, err := Open(context.Background(), Options{URL: c.URLNoPassword("postgres"), Password: pgtest.Password, Schema: freshSchema()})
	if err != nil {
		t.Fatalf("Open with Options.Password: %v", err)
	}
	s.Close()
	_, err = Open(context.Background(), Options{URL: c.URLNoPassword("postgres"), Password: "wrong-pw-123", Schema: freshSchema()})
	if err == nil || strings.Contains(err.Error(), "wrong-pw-123") {
		t.Fatalf("Open with a wrong password: %v", err)
	}
}

// TestListUsesIndex checks that List's prefix is a range scan of the
// primary key, not a scan of every resource.
func TestListUsesIndex(t *testing.T) {
	s := open(t, freshSchema())
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.schema+`.resources (resource) SELECT 'r' || g FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `ANALYZE `+s.schema+`.resources`); err != nil {
		t.Fatal(err)
	}
	for _, after := range []string{"", "r125"} { // the first page, and one after a cursor
		var plan strings.Builder
		rows, err := s.pool.Query(ctx, `EXPLAIN `+s.sql.list, "r12", "r12\x7f", 10, after)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			rows.Scan(&line)
			plan.WriteString(line + "\n")
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		if !strings.Contains(plan.String(), "Index") || strings.Contains(plan.String(), "Seq Scan") {
			t.Fatalf("List's plan (after %q) does not use the primary key:\n%s", after, plan.String())
		}
	}
}

// TestListPrefixIsLiteral: a prefix is matched byte for byte, with no
// pattern characters (names may hold _ and ., LIKE's wildcards and more).
func TestListPrefixIsLiteral(t *testing.T) {
	s := open(t, freshSchema())
	ctx := context.Background()
	for _, r := range []string{"a_b", "axb", "a.b", "a~", "a~z", "b"} {
		if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: r, Owner: "o", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	for prefix, want := range map[string]string{"a_": "a_b", "a~": "a~ a~z", "a": "a.b a_b axb a~ a~z", "": "a.b a_b axb a~ a~z b"} {
		leases, err := s.List(ctx, fencing.ListRequest{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range leases {
			got = append(got, l.Resource)
		}
		if strings.Join(got, " ") != want {
			t.Errorf("List(%q) = %v, want %s", prefix, got, want)
		}
	}
}

// TestExpiryFollowsDatabaseClock: leases are stamped by the server's
// clock, not the gate's.
func TestExpiryFollowsDatabaseClock(t *testing.T) {
	s := open(t, freshSchema())
	ctx := context.Background()
	var before, after time.Time
	s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before)
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "clock", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after)
	if l.AcquiredAt.Before(before.Truncate(time.Millisecond)) || l.AcquiredAt.After(after) || !l.ExpiresAt.Equal(l.AcquiredAt.Add(time.Minute)) {
		t.Fatalf("lease %v..%v, database clock %v..%v", l.AcquiredAt, l.ExpiresAt, before, after)
	}
}

// TestClosedIsUnavailable: every call on a closed store fails closed with
// ErrUnavailable.
func TestClosedIsUnavailable(t *testing.T) {
	s := open(t, freshSchema())
	s.Close()
	ctx := context.Background()
	if err := s.Ping(ctx); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Ping: %v", err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: 1}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Admit: %v", err)
	}
}

// TestRestoreRecipe runs the statement docs/stores.md gives for a database
// restored from an older backup (or a lossy failover), over a restore
// simulated by copying the rows back: after it, no token issued before is
// admitted (not one issued before the backup, nor ones issued and
// superseded after it), the restored live lease is over, and the next
// acquisition is admitted.
func TestRestoreRecipe(t *testing.T) {
	doc, err := os.ReadFile("../../docs/stores.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "```sql\n  UPDATE fencegate.resources")
	recipe, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("docs/stores.md has no restore statement (```sql UPDATE fencegate.resources … ```)")
	}
	s := open(t, freshSchema())
	recipe = "UPDATE " + s.schema + ".resources" + recipe
	ctx := context.Background()
	acquire := func(owner string) fencing.Token {
		t.Helper()
		l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: owner, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: l.Token}); err != nil {
			t.Fatal(err)
		}
		return l.Token
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t1 := acquire("a")
	exec(`CREATE TABLE ` + s.schema + `.backup AS SELECT * FROM ` + s.schema + `.resources`)
	// The window lost by the restore is as long as the backup is old: longer
	// than a second here, as it would be for any real backup.
	time.Sleep(1100 * time.Millisecond)
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "r", Owner: "a", Token: t1}); err != nil {
		t.Fatal(err)
	}
	t2 := acquire("b")
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "r", Owner: "b", Token: t2}); err != nil {
		t.Fatal(err)
	}
	t3 := acquire("c")
	exec(`DELETE FROM ` + s.schema + `.resources`)
	exec(`INSERT INTO ` + s.schema + `.resources SELECT * FROM ` + s.schema + `.backup`)
	exec(recipe)

	for _, tok := range []fencing.Token{t1, t2, t3} {
		var stale *fencing.StaleTokenError
		if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: tok}); !errors.As(err, &stale) {
			t.Errorf("Admit(%d) after the restore statement: %v, want stale-token", tok, err)
		}
	}
	if _, err := s.Renew(ctx, fencing.RenewRequest{Resource: "r", Owner: "a", Token: t1, TTL: time.Minute}); !errors.Is(err, fencing.ErrLeaseLost) {
		t.Errorf("renewing the lease restored live: %v, want lease-lost", err)
	}
	if t4 := acquire("d"); t4 <= t3 {
		t.Errorf("the acquisition after the restore statement got %d, not above %d", t4, t3)
	}
}
