package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// TestSessionSettings: a database whose defaults an administrator set
// (TimeZone far from UTC, a non-ISO DateStyle, an SQL-standard
// IntervalStyle, a short lock_timeout and statement_timeout, idle
// timeouts) must not change expiry or tokens, in every query mode a URL
// may choose. Open pins DateStyle and IntervalStyle unless the URL sets
// them.
func TestSessionSettings(t *testing.T) {
	t.Run("iso", func(t *testing.T) { sessionSettings(t, "fg_session", "ISO, DMY") })
	// DateStyle's output format is the database's default; in the text
	// query modes (exec, simple_protocol: what a URL behind PgBouncer's
	// transaction pooling often chooses) pgx parses timestamps as ISO only.
	t.Run("sql_dmy", func(t *testing.T) { sessionSettings(t, "fg_session_sql", "SQL, DMY") })
}

func sessionSettings(t *testing.T, db, dateStyle string) {
	c := pgtest.Need(t, cluster)
	for _, sql := range []string{`DROP DATABASE IF EXISTS ` + db, `CREATE DATABASE ` + db,
		`ALTER DATABASE ` + db + ` SET TimeZone = 'Pacific/Kiritimati'`,
		`ALTER DATABASE ` + db + ` SET DateStyle = '` + dateStyle + `'`,
		`ALTER DATABASE ` + db + ` SET IntervalStyle = 'sql_standard'`,
		`ALTER DATABASE ` + db + ` SET statement_timeout = '1ms'`,
		`ALTER DATABASE ` + db + ` SET idle_in_transaction_session_timeout = '1ms'`,
		`ALTER DATABASE ` + db + ` SET lock_timeout = '1ms'`,
		`ALTER DATABASE ` + db + ` SET extra_float_digits = '-15'`,
	} {
		if err := c.Exec("postgres", sql); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			schema := freshSchema()
			s, err := Open(ctx, Options{URL: c.SocketURL(db) + "&default_query_exec_mode=" + mode, Schema: schema,
				StatementTimeout: 5 * time.Second, Retention: time.Hour, SweepInterval: time.Hour})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "tz", Owner: "a", TTL: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if d := l.ExpiresAt.Sub(l.AcquiredAt); d != time.Second {
				t.Errorf("lease of 1s: acquired %v expires %v", l.AcquiredAt, l.ExpiresAt)
			}
			if d := l.AcquiredAt.Sub(now); d > time.Second || d < -time.Second {
				t.Errorf("acquired_at %v, host now %v", l.AcquiredAt, now)
			}
			if tok := time.UnixMicro(int64(l.Token)); tok.Sub(now) > time.Second || now.Sub(tok) > time.Second {
				t.Errorf("token %d is not the clock in µs (%v)", l.Token, tok)
			}
			st, err := s.Status(ctx, "tz")
			if err != nil || st.Lease == nil || !st.Lease.ExpiresAt.Equal(l.ExpiresAt) {
				t.Fatalf("status: %+v %v", st, err)
			}
			ls, err := s.List(ctx, fencing.ListRequest{Prefix: "t"})
			if err != nil || len(ls) != 1 || !ls[0].ExpiresAt.Equal(l.ExpiresAt) {
				t.Fatalf("list: %+v %v", ls, err)
			}
			if _, err := s.Sweep(ctx); err != nil {
				t.Fatalf("sweep: %v", err)
			}
			if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "tz", Owner: "b", TTL: time.Second}); err == nil {
				t.Fatal("b acquired a's live lease")
			}
			time.Sleep(time.Until(l.ExpiresAt) + 20*time.Millisecond)
			l2, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "tz", Owner: "b", TTL: time.Second})
			if err != nil || l2.Token <= l.Token {
				t.Fatalf("after a's expiry: %+v %v", l2, err)
			}
			// A long-held row lock with lock_timeout 1ms on the database:
			// refused as a fault, fast.
			tx, err := s.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `SELECT 1 FROM `+schema+`.resources WHERE resource = 'tz' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = s.Renew(ctx, fencing.RenewRequest{Resource: "tz", Owner: "b", Token: l2.Token})
			if !errors.Is(err, fencing.ErrUnavailable) {
				t.Fatalf("renew behind a lock: %v", err)
			}
			t.Logf("renew behind a held lock: %v after %v", err, time.Since(start))
		})
	}
}
