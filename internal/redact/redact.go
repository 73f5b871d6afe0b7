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
// its credential parameters shown as "xxxxx". A value with a scheme that
// does not parse as a URL (a bad escape in its password, say) is shown as
// its scheme alone; a value without "://" that does not parse (a host and
// port) is returned as is, as is one without a scheme: neither carries a
// URL's credentials.
func URL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		if scheme, _, ok := strings.Cut(s, "://"); ok {
			return scheme + "://(not shown: not a valid URL)"
		}
		return s
	}
	if u.Scheme == "" {
		return s
	}
	return Parsed(u)
}

// Parsed is URL for a parsed URL; u is not changed. The query is masked
// pair by pair as written, so that a pair with a bad escape, which
// url.Values would drop, is masked too.
func Parsed(u *url.URL) string {
	c := *u
	if c.RawQuery != "" {
		pairs := strings.Split(c.RawQuery, "&")
		for i, p := range pairs {
			if k, _, ok := strings.Cut(p, "="); ok && credential(unescape(k)) {
				pairs[i] = k + "=xxxxx"
			}
		}
		c.RawQuery = strings.Join(pairs, "&")
	}
	return c.Redacted()
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
	}
	for p := range strings.SplitSeq(u.RawQuery, "&") {
		if k, v, ok := strings.Cut(p, "="); ok && credential(unescape(k)) {
			add(v)
			add(unescape(v))
		}
	}
	return out
}

// Message is msg with every one of u's credentials (Secrets) shown as
// "xxxxx".
func Message(msg string, u *url.URL) string {
	for _, s := range Secrets(u) {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return msg
}
