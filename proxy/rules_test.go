package proxy

import (
	"strings"
	"testing"

	"github.com/fencegate/fencegate/fencing"
)

func TestParseRulesErrors(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"PUT /jobs/{id}", "line 1"},
		{"\n\nPUT /jobs/{id} frobnicate", `line 3: "PUT /jobs/{id} frobnicate": unknown action "frobnicate"`},
		{"put /jobs/{id} pass", `case-sensitive, write "PUT"`},
		{"GET /jobs/{id} deny", "safe methods are never fenced"},
		{"PUT,*,POST /x pass", `"*" must stand alone`},
		{"PUT, /x pass", "empty method"},
		{"P(T /x pass", "not an HTTP method token"},
		{"PUT jobs pass", "must start with /"},
		{"PUT /jobs/x{id} pass", "whole segment"},
		{"PUT /jobs/{} pass", "whole segment"},
		{"PUT /jobs/{i-d} pass", "variable name"},
		{"PUT /a/{x}/{x} pass", "appears twice"},
		{"PUT /a/{rest...}/b pass", "last segment"},
		{"PUT /a/../b pass", "never match"},
		{"PUT /a pass now", "takes no arguments"},
		{"PUT /a fence", "one resource template"},
		{"PUT /a fence strict", "one resource template"},
		{"PUT /a fence a b", "one resource template"},
		{"PUT /a/{id} fence job/{id}", "not allowed in a resource name"},
		{"PUT /a/{id} fence job:{nope}", "not a variable"},
		{"PUT /a/{id} fence job:{id", "unclosed {"},
		{"PUT /a/{id} fence job:}", "unmatched }"},
		{"PUT /a pass; POST /b frob", "line 1"},
		{"* /ws upgrade websocket", "names its safe methods"},
		{"POST /ws upgrade websocket", "upgrades are refused on unsafe methods"},
		{"GET /ws upgrade", "one comma-separated list"},
		{"GET /ws upgrade websocket,h2c", "h2c"},
		{"GET /ws upgrade web(socket", "not a protocol name"},
		{"GET /ws pass", "safe methods are never fenced"},
		// A template that can only give names longer than a resource's.
		{"PUT /a/{id} fence " + strings.Repeat("a", 201), "at least 201 bytes"},
		{"PUT /a/{id} fence " + strings.Repeat("a", 200) + "{id}", "at least 201 bytes"},
	} {
		_, err := ParseRules(c.text)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseRules(%q) = %v, want an error containing %q", c.text, err, c.want)
		}
	}
}

// TestParseRulesTakesTemplatesUpToTheLongestName: a template whose
// shortest name fits is taken: 200 bytes, or 199 and a segment, or 200 and
// a rest of the path that may be empty.
func TestParseRulesTakesTemplatesUpToTheLongestName(t *testing.T) {
	for _, text := range []string{
		"PUT /a fence " + strings.Repeat("a", 200),
		"PUT /a/{id} fence " + strings.Repeat("a", 199) + "{id}",
		"PUT /a/{rest...} fence " + strings.Repeat("a", 200) + "{rest}",
	} {
		if _, err := ParseRules(text); err != nil {
			t.Errorf("ParseRules(%.40q...) = %v, want it taken", text, err)
		}
	}
}

func TestParseRulesAndMatch(t *testing.T) {
	rules, err := ParseRules(`
		# comment line
		PUT,PATCH,DELETE /jobs/{id}          fence job:{id}   # trailing comment
		POST             /jobs/{id}/finish   fence strict job:{id}
		POST             /t/{tenant}/k/{key} fence kv:{tenant}.{key}
		POST             /healthcheck        pass ; * /admin/{rest...} deny
		*                /files/{path...}    fence files
		PUT,PUT          /dup                pass
		*                /                   deny
	`)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 8 {
		t.Fatalf("got %d rules", len(rules))
	}
	if r := rules[0]; r.Line != 3 || strings.Join(r.Methods, ",") != "PUT,PATCH,DELETE" || r.Action != ActionFence || r.Strict || r.Template != "job:{id}" {
		t.Fatalf("rule 0: %+v", r)
	}
	if !rules[1].Strict || rules[3].Action != ActionPass || rules[4].Action != ActionDeny || rules[4].Methods != nil || rules[4].Line != 6 {
		t.Fatalf("rules: %+v", rules)
	}
	if len(rules[6].Methods) != 1 {
		t.Fatalf("duplicate methods kept: %v", rules[6].Methods)
	}
	for _, c := range []struct {
		method, path string
		line         int // 0: no rule
		action       Action
		resource     string
	}{
		{"PUT", "/jobs/7", 3, ActionFence, "job:7"},
		{"DELETE", "/jobs/a%3Ab", 3, ActionFence, "job:a:b"},
		{"POST", "/jobs/7", 0, 0, ""},
		{"PUT", "/jobs/", 0, 0, ""},
		{"PUT", "/jobs/7/", 0, 0, ""},
		{"PUT", "/jobs", 0, 0, ""},
		{"POST", "/jobs/7/finish", 4, ActionFence, "job:7"},
		{"POST", "/t/acme/k/x1", 5, ActionFence, "kv:acme.x1"},
		{"POST", "/healthcheck", 6, ActionPass, ""},
		{"PUT", "/healthcheck", 0, 0, ""},
		{"PURGE", "/admin", 0, 0, ""},
		{"PURGE", "/admin/", 6, ActionDeny, ""},
		{"PATCH", "/admin/a/b/c", 6, ActionDeny, ""},
		{"POST", "/files/a/b", 7, ActionFence, "files"},
		{"POST", "/", 9, ActionDeny, ""},
	} {
		segs, err := splitPath(c.path)
		if err != nil {
			t.Fatal(err)
		}
		var got *Rule
		var vars pathVars
		for i := range rules {
			if v, ok := rules[i].match(c.method, segs, nil); ok {
				got, vars = &rules[i], v
				break
			}
		}
		if c.line == 0 {
			if got != nil {
				t.Errorf("%s %s matched line %d", c.method, c.path, got.Line)
			}
			continue
		}
		if got == nil || got.Line != c.line || got.Action != c.action {
			t.Errorf("%s %s matched %+v, want line %d", c.method, c.path, got, c.line)
			continue
		}
		if c.action == ActionFence {
			if res := got.resource(vars); res != c.resource {
				t.Errorf("%s %s: resource %q, want %q", c.method, c.path, res, c.resource)
			}
		}
	}
}

func TestParseUpgradeRule(t *testing.T) {
	rules, err := ParseRules("GET /ws/{rest...} upgrade WebSocket,chat")
	if err != nil {
		t.Fatal(err)
	}
	if r := rules[0]; r.Action != ActionUpgrade || strings.Join(r.Protocols, ",") != "websocket,chat" || strings.Join(r.Methods, ",") != "GET" {
		t.Fatalf("%+v", r)
	}
}

// TestCheckPath pins what a canonical path is (see CheckPath).
func TestCheckPath(t *testing.T) {
	for _, p := range []string{
		"/", "/jobs/7", "/jobs/7/", "/a:b@c/!$&'()*+,=", "/files/a%20b", "/jobs/a%3Ab",
		"/files/%E2%82%AC", "/files/%e2%82%ac", "/a%5Bb%5D", "/~user/x.y-z_w",
	} {
		if err := CheckPath(p); err != nil {
			t.Errorf("CheckPath(%q) = %v, want canonical", p, err)
		}
	}
	for _, c := range []struct{ path, why string }{
		{"", "does not start with /"},
		{"jobs/7", "does not start with /"},
		{"//jobs/7", "empty path segment"},
		{"/jobs//7", "empty path segment"},
		{"/jobs/./7", "dot segment"},
		{"/jobs/..", "dot segment"},
		{"/jobs/%2e%2e", "canonical unencoded"},
		{"/jobs/%2E", "canonical unencoded"},
		{"/jobs/%41", "canonical unencoded"},
		{"/jobs%2F7", "encoded '/'"},
		{"/jobs%2f7", "encoded '/'"},
		{"/jobs%5C7", "encoded '\\\\'"},
		{"/jobs%3B7", "encoded ';'"},
		{"/jobs%257", "encoded '%'"},
		{"/jobs/%00", "control byte"},
		{"/jobs/%7F", "control byte"},
		{"/jobs/%0a", "control byte"},
		{"/jobs/%c0%af", "invalid UTF-8"},
		{"/jobs/%e2%82", "invalid UTF-8"},
		{"/jobs/%zz", "invalid percent-encoding"},
		{"/jobs/%4", "invalid percent-encoding"},
		{"/jobs/%", "invalid percent-encoding"},
		{"/jobs;x/7", "not allowed"},
		{"/jobs\\7", "not allowed"},
		{"/jobs/\xc3\xa9", "not allowed"},
		{"/jobs/a b", "not allowed"},
		{"/jobs/a#b", "not allowed"},
		{"/jobs/a\x00", "not allowed"},
	} {
		err := CheckPath(c.path)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("CheckPath(%q) = %v, want an error about %q", c.path, err, c.why)
		}
	}
}

func TestSplitPathRefusesDotSegments(t *testing.T) {
	for _, p := range []string{"/a/../b", "/a/./b", "/a/%2e%2E/b", "/..", "/a/%zz"} {
		if _, err := splitPath(p); err == nil {
			t.Errorf("splitPath(%q): no error", p)
		}
	}
}

// FuzzParseRules: the parser never panics; what it accepts re-parses from
// its own rendering to the same rules, every fence template names only
// pattern variables, and matching any path never panics and yields
// resources that are either valid or refused by fencing.ValidateResource.
func FuzzParseRules(f *testing.F) {
	for _, s := range []string{
		testRules,
		"PUT /jobs/{id} fence job:{id}",
		"* /a/{rest...} deny; POST /b pass",
		"PATCH /x/{a}/{b} fence strict r:{a}-{b}",
		"put /x pass",
		"PUT /{x...} fence r{x}",
		"PUT / fence {",
		"GET,HEAD /ws/{rest...} upgrade WebSocket,foo/2",
	} {
		f.Add(s, "/jobs/7")
	}
	f.Fuzz(func(t *testing.T, text, path string) {
		rules, err := ParseRules(text)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "rules: line ") {
				t.Fatalf("error does not name the line: %v", err)
			}
			return
		}
		var b strings.Builder
		for _, r := range rules {
			m := "*"
			if r.Methods != nil {
				m = strings.Join(r.Methods, ",")
			}
			b.WriteString(m + " " + r.Pattern + " " + r.Action.String())
			if r.Strict {
				b.WriteString(" strict")
			}
			if r.Template != "" {
				b.WriteString(" " + r.Template)
			}
			if r.Protocols != nil {
				b.WriteString(" " + strings.Join(r.Protocols, ","))
			}
			b.WriteString("\n")
		}
		again, err := ParseRules(b.String())
		if err != nil || len(again) != len(rules) {
			t.Fatalf("rendering %q does not re-parse: %v", b.String(), err)
		}
		segs, err := splitPath(path)
		if err != nil {
			return
		}
		for i := range rules {
			vars, ok := rules[i].match("PUT", segs, nil)
			if !ok || rules[i].Action != ActionFence {
				continue
			}
			res := rules[i].resource(vars)
			if err := fencing.ValidateResource(res); err == nil {
				for j := 0; j < len(res); j++ {
					if !fencing.IsResourceByte(res[j]) {
						t.Fatalf("valid resource %q has byte %q", res, res[j])
					}
				}
			}
		}
	})
}
