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
		msg := Message(errors.New("cannot parse `"+raw+"`: bad "+pw).Error(), raw, u)
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

// TestURLHidesCredentialsAnywhere: credentials past a bad escape, in a
// connection string of another form, after a ";" or in a fragment, and a
// password quoted as written (its escape in either case), never show.
func TestURLHidesCredentialsAnywhere(t *testing.T) {
	for _, raw := range []string{
		"postgres:/app%zz?password=S3cret",                    // parse error, no "://": returned as is
		"unix:/run/a%zz.sock?token=S3cret",                    // same, an upstream value
		"host=db user=u password=S3cret",                      // libpq keyword form: no scheme, returned as is
		"postgres://u@db/app?sslmode=require;password=S3cret", // ';' in the query: one pair, key sslmode
		"postgres://u@db/app#password=S3cret",
	} {
		if got := URL(raw); strings.Contains(got, "S3cret") {
			t.Errorf("URL(%q) = %q: the password shows", raw, got)
		}
	}
	// Message: the password as written with a lower-case escape is none of
	// Secrets' forms.
	raw := "postgres://u:S3cret%2fpw@db:bad/app"
	u := &url.URL{Scheme: "postgres", User: url.UserPassword("u", "S3cret/pw"), Host: "db", Path: "/app"}
	if got := Message(errors.New("cannot parse `"+raw+"`").Error(), raw, u); strings.Contains(got, "S3cret") {
		t.Errorf("Message = %q: the password shows", got)
	}
	u2, err := url.Parse("postgres://u:S3cret%2fpw@db/app")
	if err != nil {
		t.Fatal(err)
	}
	if got := Message("failed: postgres://u:S3cret%2fpw@db/app", "postgres://u:S3cret%2fpw@db/app", u2); strings.Contains(got, "S3cret") {
		t.Errorf("Message(as written, lower-case escape) = %q: the password shows", got)
	}
}
