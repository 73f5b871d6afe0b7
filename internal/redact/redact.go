// Package redact hides the credentials a URL may carry, so that logs,
// errors and printed configurations never show them.
package redact

import (
	"net/url"
	"strings"
)

// credentialWords mark a query parameter whose value is a credential
// (PostgreSQL's password and sslpassword, a token, a secret, an API key).
var credentialWords = []string{"pass", "secret", "token", "key", "auth"}

// credential reports whether a query parameter named k carries one.
func credential(k string) bool {
	k = strings.ToLower(k)
	for _, w := range credentialWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// URL is s with the password of its user information and the values of
// its credential parameters (in its query or its fragment, pairs split at
// "&" or ";") shown as "xxxxx". A value that does not parse as a URL with
// a scheme is returned as is unless it carries a credential pair
// anywhere ("password=…", as in a libpq connection string, or a query
// past a bad escape), in which case it is not shown at all.
func URL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		if hasCredentialPair(s) || err != nil && strings.Contains(s, "@") {
			return "(not shown: it may carry a credential)"
		}
		return s
	}
	return Parsed(u)
}

// Parsed is URL for a parsed URL; u is not changed. Pairs are masked as
// written, so that one with a bad escape, which url.Values would drop, is
// masked too.
func Parsed(u *url.URL) string {
	c := *u
	c.RawQuery = maskPairs(c.RawQuery)
	if c.Fragment != "" && hasCredentialPair(c.EscapedFragment()) {
		c.Fragment, c.RawFragment = "xxxxx", ""
	}
	return c.Redacted()
}

// maskPairs masks the values of the credential pairs of a query as
// written, its separators kept.
func maskPairs(q string) string {
	var b strings.Builder
	start := 0
	for i := 0; i <= len(q); i++ {
		if i < len(q) && !isPairSep(rune(q[i])) {
			continue
		}
		p := q[start:i]
		if k, _, ok := strings.Cut(p, "="); ok && credential(unescape(k)) {
			p = k + "=xxxxx"
		}
		b.WriteString(p)
		if i < len(q) {
			b.WriteByte(q[i])
		}
		start = i + 1
	}
	return b.String()
}

func isPairSep(r rune) bool { return r == '&' || r == ';' }

// hasCredentialPair reports whether s holds a word "key=value" whose key
// names a credential, separated from the rest by blanks, "&", ";", "?"
// or "#".
func hasCredentialPair(s string) bool {
	for _, w := range strings.FieldsFunc(s, func(r rune) bool {
		return r == ' ' || r == '\t' || r == '&' || r == ';' || r == '?' || r == '#'
	}) {
		if k, _, ok := strings.Cut(w, "="); ok && credential(unescape(k)) {
			return true
		}
	}
	return false
}

// unescape is a query key or value unescaped, or as written when it does
// not unescape.
func unescape(s string) string {
	if v, err := url.QueryUnescape(s); err == nil {
		return v
	}
	return s
}

// Secrets lists the credentials u carries (its user's password, its
// credential parameters' values), as written and unescaped, for scrubbing
// from messages that may quote them (a parser's error).
func Secrets(u *url.URL) []string {
	var out []string
	add := func(v string) {
		if v != "" {
			out = append(out, v, url.QueryEscape(v), url.PathEscape(v))
		}
	}
	if pw, ok := u.User.Password(); ok {
		add(pw)
		if _, rawPW, ok := strings.Cut(u.User.String(), ":"); ok {
			add(rawPW)
		}
	}
	for _, p := range strings.FieldsFunc(u.RawQuery, isPairSep) {
		if k, v, ok := strings.Cut(p, "="); ok && credential(unescape(k)) {
			add(v)
			add(unescape(v))
		}
	}
	return out
}

// SecretsOf is Secrets for the URL as written, raw: also the password
// exactly as spelt there (an escape may be written in either case).
func SecretsOf(raw string, u *url.URL) []string {
	out := Secrets(u)
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		if at := strings.LastIndex(strings.SplitN(rest, "/", 2)[0], "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok && pw != "" {
				out = append(out, pw)
			}
		}
	}
	return out
}

// Message is msg with every one of the credentials of raw, parsed as u,
// (SecretsOf) shown as "xxxxx".
func Message(msg, raw string, u *url.URL) string {
	for _, s := range SecretsOf(raw, u) {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return msg
}
