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
// its credential parameters shown as "xxxxx". A value that does not parse
// as a URL with a scheme is returned as is: it is no URL, and carries no
// URL's credentials.
func URL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return s
	}
	return Parsed(u)
}

// Parsed is URL for a parsed URL; u is not changed.
func Parsed(u *url.URL) string {
	c := *u
	if c.RawQuery != "" {
		q := c.Query()
		changed := false
		for k := range q {
			if credential(k) {
				q[k] = []string{"xxxxx"}
				changed = true
			}
		}
		if changed {
			c.RawQuery = q.Encode()
		}
	}
	return c.Redacted()
}

// Secrets lists the credentials u carries (its user's password, its
// credential parameters' values), as given and as escaped in a query, for
// scrubbing from messages that may quote them (a parser's error).
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
	for k, vs := range u.Query() {
		if credential(k) {
			for _, v := range vs {
				add(v)
			}
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
