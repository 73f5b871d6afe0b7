package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// TestSearchPathShadowsClock: the functions in the store's SQL
// (clock_timestamp(), …) must be the database's whatever the session's
// search_path. A role's or database's search_path that lists pg_catalog
// after a schema others can create functions in would otherwise let a
// function of the same name there judge expiry and tokens. Open pins
// search_path unless the URL sets it, and qualifies every function with
// pg_catalog, so even a URL's search_path cannot.
func TestSearchPathShadowsClock(t *testing.T) {
	c := pgtest.Need(t, cluster)
	const db = "fg_searchpath"
	for _, sql := range []string{`DROP DATABASE IF EXISTS ` + db, `CREATE DATABASE ` + db} {
		if err := c.Exec("postgres", sql); err != nil {
			t.Fatal(err)
		}
	}
	for _, sql := range []string{
		`CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2001-01-01 00:00:00+00'::timestamptz $$`,
		`CREATE FUNCTION public.floor(numeric) RETURNS numeric LANGUAGE sql AS $$ SELECT 7::numeric $$`,
		`CREATE FUNCTION public.count(text) RETURNS bigint LANGUAGE sql AS $$ SELECT 0::bigint $$`,
		`ALTER DATABASE ` + db + ` SET search_path = public, pg_catalog`,
	} {
		if err := c.Exec(db, sql); err != nil {
			t.Fatal(err)
		}
	}
	for name, url := range map[string]string{
		"database": c.SocketURL(db),
		"url":      c.SocketURL(db) + "&search_path=public,pg_catalog",
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s, err := Open(ctx, Options{URL: url, Schema: freshSchema(), StatementTimeout: 5 * time.Second,
				Retention: time.Millisecond, SweepInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "sp", Owner: "a", TTL: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(l.AcquiredAt); d > time.Minute || d < -time.Minute {
				t.Errorf("acquired_at %v: not the database's clock", l.AcquiredAt)
			}
			if d := time.Since(time.UnixMicro(int64(l.Token))); d > time.Minute || d < -time.Minute {
				t.Errorf("token %d: not the database's clock in µs", l.Token)
			}
			// A live lease: listed, and never swept (by the clock of 2001
			// its expiry would be far in the future, by the real one too).
			if ls, err := s.List(ctx, fencing.ListRequest{Prefix: "sp"}); err != nil || len(ls) != 1 {
				t.Errorf("list: %+v %v", ls, err)
			}
			if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "sp", Owner: "a", Token: l.Token}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			// Released and idle past the retention on the real clock: swept
			// (by the clock of 2001 it would be kept).
			if n, err := s.Sweep(ctx); err != nil || n != 1 {
				t.Errorf("sweep: removed %d %v, want 1", n, err)
			}
		})
	}
}
