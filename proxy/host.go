package proxy

import (
	"net/netip"
	"strings"
)

// ValidHost reports whether a Host header value is a plain authority
// without user information: a host name (letters, digits, '-', '.', '_'
// and '~', RFC 3986's unreserved characters), an IPv4 address or a
// bracketed IPv6 address, with an optional port of at most five digits.
// The empty value (HTTP/1.1 allows it for a target without authority) is
// valid. Percent-encoding, sub-delimiters, '/', '\\', '?', '#', spaces and
// unbalanced brackets are not: an upstream that builds a URL or a route
// from Host could read them as a path, a query or another host.
func ValidHost(h string) bool {
	if h == "" {
		return true
	}
	host, port := h, ""
	if h[0] == '[' {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return false
		}
		a, err := netip.ParseAddr(h[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return false
		}
		rest := h[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return false
			}
			port = rest[1:]
			if !validPort(port) {
				return false
			}
		}
		return true
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		host, port = h[:i], h[i+1:]
		if !validPort(port) {
			return false
		}
	}
	if host == "" {
		return false
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
		default:
			return false
		}
	}
	return true
}

// validPort reports whether p is a port: one to five digits.
func validPort(p string) bool {
	if p == "" || len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}
