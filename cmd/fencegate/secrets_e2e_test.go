package main

import (
	"strings"
	"testing"
)

// pgSecret is a PostgreSQL password no output may show.
const pgSecret = "S3cretPgPw"

// TestPostgresPasswordNeverPrinted: a postgres URL may carry its password
// as ?password= (pgx and libpq take it), or take its host from ?host=
// (empty URL host); a libpq connection string may be set where a URL
// belongs. Neither serve's refusals (a server that cannot be reached, a URL
// pgx cannot parse, a value that is no URL) nor `fencegate check` print the
// password (docs/stores.md: errors and logs never show it).
func TestPostgresPasswordNeverPrinted(t *testing.T) {
	addrs := []string{"FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_PROXY_ADDR=127.0.0.1:0"}
	for _, store := range []string{
		"postgres://fencegate@127.0.0.1:1/app?sslmode=disable&connect_timeout=1&password=" + pgSecret,
		"postgres://fencegate@127.0.0.1:1/app?connect_timeout=soon&password=" + pgSecret,
		"postgres://fencegate:" + pgSecret + "@/app?host=/nonexistent/socket/dir&connect_timeout=1",
		"postgres:///app?host=/nonexistent/socket/dir&connect_timeout=1&password=" + pgSecret,
		"host=db user=fencegate password=" + pgSecret + " dbname=app",
	} {
		env := append([]string{"FENCEGATE_STORE=" + store}, addrs...)
		if r := fg(t, env, "", "serve"); r.code == exitOK || strings.Contains(r.stdout+r.stderr, pgSecret) {
			t.Errorf("serve with FENCEGATE_STORE=%s: exit %d, output shows the password or it started:\n%s%s", store, r.code, r.stdout, r.stderr)
		}
		if r := fg(t, env, "", "check"); strings.Contains(r.stdout+r.stderr, pgSecret) {
			t.Errorf("check with FENCEGATE_STORE=%s (exit %d) shows the password:\n%s%s", store, r.code, r.stdout, r.stderr)
		}
	}
}
