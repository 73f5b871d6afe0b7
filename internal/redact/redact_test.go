package redact

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// TestURLHidesEveryCredential: a store URL's password, wherever libpq and
// pgx take one (user information, ?password=, ?sslpassword=, with the host
// in ?host= or none at all), never shows; the rest of the URL does.
func TestURLHidesEveryCredential(t *testing.T) {
	const pw = "S3cret/pw+x"
	for _, raw := range []string{
		"postgres://fencegate@db:5432/app?password=" + url.QueryEscape(pw),
		"postgres://fencegate@db:5432/app?sslmode=verify-full&sslpassword=" + url.QueryEscape(pw),
		"postgres://fencegate:" + url.PathEscape(pw) + "@/app?host=/run/postgresql",
		"postgres:///app?host=/run/postgresql&password=" + url.QueryEscape(pw),
		"valkeys://default:" + url.PathEscape(pw) + "@cache:6380/0",
		"unix:/run/app.sock?token=" + url.QueryEscape(pw),
	} {
		got := URL(raw)
		if strings.Contains(got, "S3cret") {
			t.Errorf("URL(%q) = %q: the password shows", raw, got)
		}
		if !strings.Contains(got, "xxxxx") {
			t.Errorf("URL(%q) = %q: nothing masked", raw, got)
		}
		u, _ := url.Parse(raw)
		msg := Message(errors.New("cannot parse `"+raw+"`: bad "+pw).Error(), u)
		if strings.Contains(msg, "S3cret") {
			t.Errorf("Message for %q = %q: the password shows", raw, msg)
		}
	}
	// Bad escapes: url.Values drops the pair, url.Parse refuses the URL.
	for _, raw := range []string{
		"postgres://h/db?password=S3cret%zz",
		"postgres://u:S3cret%zz@h/db",
		"http://u:S3cret%@h",
	} {
		if got := URL(raw); strings.Contains(got, "S3cret") {
			t.Errorf("URL(%q) = %q: the password shows", raw, got)
		}
	}
	for _, plain := range []string{"127.0.0.1:7070", "file:fencegate.db", "30s", "/etc/fencegate/rules", "postgres://db/app?sslmode=require"} {
		if got := URL(plain); got != plain {
			t.Errorf("URL(%q) = %q, want it unchanged", plain, got)
		}
	}
}
