package proxy

import "testing"

func TestValidHost(t *testing.T) {
	valid := []string{"", "example.com", "EXAMPLE.com:8080", "127.0.0.1", "127.0.0.1:80", "[::1]", "[::1]:8080",
		"a_b.internal", "x~y", "localhost:65535", "svc-1.ns.svc.cluster.local"}
	invalid := []string{"x/../jobs/b", "x y", `x\y`, "[::1", "x?y", "x#y", "%2e%2e", "a@b", "a:b:c", ":80",
		"a:", "a:123456", "[::1]x", "[::1]:", "[127.0.0.1]", "[fe80::1%25eth0]", "a\tb", "a\x00b", "a;b", "a,b", "[::1]]"}
	for _, h := range valid {
		if !ValidHost(h) {
			t.Errorf("ValidHost(%q) = false, want true", h)
		}
	}
	for _, h := range invalid {
		if ValidHost(h) {
			t.Errorf("ValidHost(%q) = true, want false", h)
		}
	}
}
