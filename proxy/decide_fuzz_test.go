package proxy

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/fencing/memstore"
)

// removeDotSegments is RFC 3986 §5.2.4, written out as the RFC states it:
// the oracle for what an upstream that resolves dot segments acts on.
func removeDotSegments(in string) string {
	var out []string // output buffer, as segments each with its leading "/"
	for in != "" {
		switch {
		case strings.HasPrefix(in, "../"):
			in = in[3:]
		case strings.HasPrefix(in, "./"):
			in = in[2:]
		case strings.HasPrefix(in, "/./"):
			in = in[2:]
		case in == "/.":
			in = "/"
		case strings.HasPrefix(in, "/../"):
			in = in[3:]
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		case in == "/..":
			in = "/"
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		case in == "." || in == "..":
			in = ""
		default:
			i := 0
			if in[0] == '/' {
				i = 1
			}
			j := strings.IndexByte(in[i:], '/')
			if j < 0 {
				j = len(in)
			} else {
				j += i
			}
			out = append(out, in[:j])
			in = in[j:]
		}
	}
	return strings.Join(out, "")
}

func TestRemoveDotSegments(t *testing.T) {
	// The examples of RFC 3986 §5.2.4 and §5.4.
	for in, want := range map[string]string{
		"/a/b/c/./../../g":   "/a/g",
		"mid/content=5/../6": "mid/6",
		"/a/b/../../../g":    "/g",
		"/a/./b/":            "/a/b/",
		"/a/..":              "/",
		"/":                  "/",
	} {
		if got := removeDotSegments(in); got != want {
			t.Errorf("removeDotSegments(%q) = %q, want %q", in, got, want)
		}
	}
}

// upstreamResolves is the path an RFC 3986 upstream acts on: the path of
// target, percent-decoded, then with dot segments removed. ok is false
// when the upstream would refuse it (bad escape).
func upstreamResolves(target string) (string, bool) {
	p, _, _ := strings.Cut(target, "?")
	d, err := url.PathUnescape(p)
	if err != nil {
		return "", false
	}
	return removeDotSegments(d), true
}

// oracleRoute matches a decoded path against the rules with plain
// string splitting, independent of the gate's segment decoding.
func oracleRoute(rules []Rule, method, decoded string) (*Rule, string) {
	segs := strings.Split(strings.TrimPrefix(decoded, "/"), "/")
	for i := range rules {
		r := &rules[i]
		if r.Action == ActionUpgrade {
			continue
		}
		if vars, ok := r.match(method, segs, nil); ok {
			if r.Action == ActionFence {
				return r, r.resource(vars)
			}
			return r, ""
		}
	}
	return nil, ""
}

// FuzzDecide checks the gate's decision against an independent oracle:
// whenever it forwards an unsafe request (fenced or under a pass rule),
// the path an upstream resolves (RFC 3986: percent-decoded, dot segments
// removed, and decoded once more for upstreams that decode twice) maps to
// the same rule and resource as the gate matched, for the request's own
// path and for its Destination; and the upstream gets the target's path
// byte for byte.
func FuzzDecide(f *testing.F) {
	for _, s := range [][3]string{
		{"PUT", "/jobs/1", ""},
		{"PUT", "/jobs/a%20b", ""},
		{"PUT", "/jobs/a%3Ab?x=1", ""},
		{"POST", "/public/..%2Fjobs%2F1", ""},
		{"POST", "/public/%2e%2e/jobs/1", ""},
		{"POST", "/public/..%252Fjobs", ""},
		{"POST", "/public/..%c0%afjobs", ""},
		{"POST", "/public/a/b/", ""},
		{"PUT", "/jobs;x/1", ""},
		{"PUT", "//jobs/1", ""},
		{"put", "/jobs/1", ""},
		{"COPY", "/files/X-scratch", "/files/X"},
		{"MOVE", "/files/a", "http://gate/files/b"},
		{"COPY", "/public/a", "/jobs/%2e%2e/admin/x"},
		{"PUT", "/files/%E2%82%AC", ""},
		{"DELETE", "/files/\\x", ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	rules, err := ParseRules(hostileRules)
	if err != nil {
		f.Fatal(err)
	}
	up, _ := url.Parse("http://upstream:1/base")
	g, err := New(Options{Upstream: up, Store: memstore.New(memstore.Options{}), Rules: rules})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, method, target, dest string) {
		h := http.Header{HeaderToken: {"1"}}
		if dest != "" {
			h.Set(HeaderDestination, dest)
		}
		d := g.decide(Incoming{Method: method, Target: target, Host: "gate", Header: h})
		if safeMethod(method) || d.Verdict == Refuse {
			return
		}
		if d.Verdict == Fence && len(d.Targets) == 0 {
			t.Fatalf("fenced on no resource: %+v", d)
		}
		p, _, _ := strings.Cut(target, "?")
		once, ok := upstreamResolves(target)
		if !ok {
			t.Fatalf("forwarded %s %q, whose escapes do not decode", method, target)
		}
		if twice, err := url.PathUnescape(once); err != nil || twice != once {
			t.Fatalf("forwarded %s %q: a second decoding gives %q, not %q", method, target, twice, once)
		}
		if once != mustUnescape(t, p) {
			t.Fatalf("forwarded %s %q, which has dot segments: resolves to %q", method, target, once)
		}
		rule, res := oracleRoute(rules, method, once)
		if rule != d.Rule {
			t.Fatalf("%s %q: the gate matched %v, an upstream resolves %q to %v", method, target, d.Rule, once, rule)
		}
		want := map[string]bool{}
		if rule == nil || rule.Action == ActionFence {
			want[res] = true
		}
		if rule != nil && rule.Action == ActionDeny {
			t.Fatalf("%s %q forwarded under deny rule %d", method, target, rule.Line)
		}
		if dest != "" {
			dp := dest
			if u, err := url.Parse(dest); err == nil && u.Host != "" {
				dp = u.EscapedPath()
			}
			donce, ok := upstreamResolves(dp)
			if !ok {
				t.Fatalf("forwarded %s %q with Destination %q, whose escapes do not decode", method, target, dest)
			}
			drule, dres := oracleRoute(rules, method, donce)
			switch {
			case drule == nil || drule.Action == ActionDeny:
				t.Fatalf("%s %q forwarded with Destination %q, which resolves to %q: no rule fences it", method, target, dest, donce)
			case drule.Action == ActionFence:
				want[dres] = true
			}
		}
		delete(want, "") // header resource: not under test here
		for _, tg := range d.Targets {
			if !want[tg.Resource] && !(rule == nil && tg.Resource == "") {
				t.Fatalf("%s %q (Destination %q): fenced on %q, an upstream acts on %v", method, target, dest, tg.Resource, want)
			}
			delete(want, tg.Resource)
		}
		if len(want) != 0 {
			t.Fatalf("%s %q (Destination %q): %v not fenced; targets %+v", method, target, dest, want, d.Targets)
		}
		fwd := string(upstreamTarget(strings.TrimSuffix(up.EscapedPath(), "/"), "", []byte(target)))
		if path, _, _ := strings.Cut(fwd, "?"); path != "/base"+p {
			t.Fatalf("%s %q: forwarded as %q", method, target, fwd)
		}
	})
}

func mustUnescape(t *testing.T, p string) string {
	d, err := url.PathUnescape(p)
	if err != nil {
		t.Fatalf("%q: %v", p, err)
	}
	return d
}
