package proxy

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// CheckPath reports why p, the path of a request target as the client sent
// it (without the query), is not canonical, or nil when it is. The gate
// refuses an unsafe request with a non-canonical path before any rule is
// consulted (DESIGN §4): such a path is one an upstream could resolve to a
// different resource than the one the gate matched, depending on whether
// and how often it decodes, merges slashes, removes dot segments, strips
// ";" parameters, treats "\" as "/" or folds overlong UTF-8.
//
// A canonical path starts with "/" and is a sequence of segments separated
// by "/" where
//
//   - no segment is empty, except the last one: a trailing slash is kept
//     and significant ("/jobs/7/" is not "/jobs/7"), "//" is refused;
//   - no segment is "." or "..";
//   - raw bytes are RFC 3986 pchar bytes other than ";": letters, digits,
//     "-._~!$&'()*+,=:@" and "%" escapes; so no "\", control byte, space,
//     non-ASCII byte, ";", "#", "[", "]", "{", "}", "|", "^", "`", "<", ">"
//     or quote;
//   - every "%" starts a two-hex-digit escape that does not encode an
//     unreserved character (letters, digits, "-._~": their canonical form
//     is unencoded), "/", "\", "%", ";" or a control byte;
//   - each segment, decoded, is valid UTF-8 (no overlong or truncated
//     sequences such as "%c0%af").
//
// The decoded segments of a canonical path are unambiguous: decoding once
// or many times, with or without dot-segment removal, gives the same
// segments the gate matched.
func CheckPath(p string) error {
	if p == "" || p[0] != '/' {
		return fmt.Errorf("the path %q does not start with /", truncate(p))
	}
	segStart := 1
	for i := 1; i <= len(p); i++ {
		if i < len(p) && p[i] != '/' {
			continue
		}
		if err := checkSegment(p[segStart:i], i == len(p)); err != nil {
			return err
		}
		segStart = i + 1
	}
	return nil
}

// checkSegment checks one raw segment; last says whether it ends the path
// (where it may be empty: a trailing slash).
func checkSegment(s string, last bool) error {
	switch s {
	case "":
		if last {
			return nil
		}
		return fmt.Errorf("empty path segment (//)")
	case ".", "..":
		return fmt.Errorf("dot segment %q", s)
	}
	var dec []byte // decoded segment, built only when it has escapes
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			if !pcharByte(c) {
				return fmt.Errorf("byte %q is not allowed in a path", c)
			}
			if dec != nil {
				dec = append(dec, c)
			}
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return fmt.Errorf("invalid percent-encoding %q", truncate(s[i:min(i+3, len(s))]))
		}
		b := unhex(s[i+1])<<4 | unhex(s[i+2])
		switch {
		case unreservedByte(b):
			return fmt.Errorf("%q encodes %q, which is canonical unencoded", s[i:i+3], b)
		case b == '/' || b == '\\' || b == '%' || b == ';':
			return fmt.Errorf("encoded %q (%s)", b, s[i:i+3])
		case b < 0x20 || b == 0x7f:
			return fmt.Errorf("encoded control byte %s", s[i:i+3])
		}
		if dec == nil {
			dec = append(make([]byte, 0, len(s)), s[:i]...)
		}
		dec = append(dec, b)
		i += 2
	}
	if dec != nil && !utf8.Valid(dec) {
		return fmt.Errorf("segment %q decodes to invalid UTF-8", truncate(s))
	}
	return nil
}

func unreservedByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// pcharByte: RFC 3986 pchar bytes, without "%" (handled as escapes) and
// without ";" (path parameters to Tomcat, Jetty and others).
func pcharByte(c byte) bool {
	return unreservedByte(c) || strings.IndexByte("!$&'()*+,=:@", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// originPath splits an origin-form request target ("/path?query") and
// returns its path, or an error for any other form: absolute-form
// ("http://host/path"), authority-form (CONNECT) and asterisk-form ("*")
// are refused for unsafe requests, which a client sends to the gate as an
// origin server, never as a forward proxy.
func originPath(target string) (string, error) {
	if target == "" || target[0] != '/' {
		return "", fmt.Errorf("the request target %q is not a path (origin-form): send the path only", truncate(target))
	}
	if i := strings.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	return target, nil
}
