package proxy

import (
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/failrecorder"
)

// This file checks Gate.decide against a model of the gate's edge written
// from DESIGN §4 and decide's contract, on random rule sets and random
// requests: the model knows by construction which targets are canonical
// and what each segment decodes to, and matches rules with its own plain
// code, so a decision that disagrees with it is a bug in one of them, and
// rapid shrinks it to a small rule set and request.

// mPiece is a piece of a path segment as sent, with what it decodes to and
// whether it may appear in a canonical path.
type mPiece struct {
	raw, dec string
	canon    bool
}

var canonPieces = []mPiece{
	{"jobs", "jobs", true}, {"a", "a", true}, {"b", "b", true}, {"1", "1", true},
	{"x", "x", true}, {"%20", " ", true}, {"%C3%A9", "é", true}, {"%c3%a9", "é", true},
	{"%3A", ":", true}, {":", ":", true}, {"~", "~", true}, {"-", "-", true}, {"@", "@", true},
}

var nonCanonPieces = []mPiece{
	// An upstream could resolve these differently from the gate.
	{"%2F", "/", false}, {"%2f", "/", false}, {"%5C", `\`, false}, {"%5c", `\`, false},
	{"%2E", ".", false}, {"%2e", ".", false}, {"%252F", "%2F", false}, {"%41", "A", false},
	{";", ";", false}, {"a;b=1", "a;b=1", false}, {"\x00", "\x00", false}, {"\x01", "\x01", false},
	{"\x7f", "\x7f", false}, {"é", "é", false}, {`\`, `\`, false}, {" ", " ", false},
	{"%zz", "", false}, {"%", "", false}, {"%c0%af", "", false}, {"%00", "\x00", false},
	{"#", "#", false}, {"{", "{", false},
}

// pieceGen draws canonical pieces three times in four.
func pieceGen() *rapid.Generator[mPiece] {
	return rapid.Custom(func(t *rapid.T) mPiece {
		if rapid.IntRange(0, 9).Draw(t, "noncanonical") == 9 {
			return rapid.SampledFrom(nonCanonPieces).Draw(t, "piece")
		}
		return rapid.SampledFrom(canonPieces).Draw(t, "piece")
	})
}

// mSegment is one path segment as sent.
type mSegment struct {
	raw, dec string
	canon    bool // canonical wherever it stands (an empty segment: only last)
}

func segmentGen() *rapid.Generator[mSegment] {
	return rapid.Custom(func(t *rapid.T) mSegment {
		switch rapid.IntRange(0, 19).Draw(t, "segkind") {
		case 18:
			return mSegment{raw: rapid.SampledFrom([]string{".", ".."}).Draw(t, "dot")}
		case 19:
			return mSegment{raw: "", dec: ""}
		}
		var s mSegment
		s.canon = true
		for _, p := range rapid.SliceOfN(pieceGen(), 1, 3).Draw(t, "pieces") {
			s.raw += p.raw
			s.dec += p.dec
			s.canon = s.canon && p.canon
		}
		return s
	})
}

// mPath is a generated path: its raw text, whether it is canonical, and
// (when it is) its decoded segments.
type mPath struct {
	raw   string
	canon bool
	segs  []string
}

func pathGen() *rapid.Generator[mPath] {
	return rapid.Custom(func(t *rapid.T) mPath {
		segs := rapid.SliceOfN(segmentGen(), 1, 4).Draw(t, "segments")
		p := mPath{canon: true}
		for i, s := range segs {
			p.raw += "/" + s.raw
			p.segs = append(p.segs, s.dec)
			last := i == len(segs)-1
			switch {
			case s.raw == "":
				p.canon = p.canon && last
			default:
				p.canon = p.canon && s.canon
			}
		}
		return p
	})
}

// mRule is a generated route rule: its text and what the model needs.
type mRule struct {
	text    string
	methods []string // nil: any method
	segs    []mPatSeg
	action  string // fence, pass, deny, upgrade
	strict  bool
	tmpl    []mPatSeg // literal parts and variable references
	protos  []string
}

type mPatSeg struct {
	lit  string // decoded literal, when name is ""
	name string
	rest bool
}

var (
	ruleLits    = []struct{ raw, dec string }{{"jobs", "jobs"}, {"a", "a"}, {"b", "b"}, {"%C3%A9", "é"}, {"x%20y", "x y"}, {"1", "1"}}
	ruleMethods = []string{"PUT", "POST", "DELETE", "PATCH", "COPY", "MOVE", "BREW"}
	reqMethods  = []string{"PUT", "DELETE", "PATCH", "COPY", "MOVE", "BREW", "put", "Post", "GET", "HEAD", "OPTIONS", "TRACE", "get", "CONNECT", "PRI", "POST"}
)

func ruleGen() *rapid.Generator[mRule] {
	return rapid.Custom(func(t *rapid.T) mRule {
		var r mRule
		r.action = rapid.SampledFrom([]string{"fence", "fence", "fence strict", "pass", "deny", "upgrade"}).Draw(t, "action")
		if r.action == "fence strict" {
			r.action, r.strict = "fence", true
		}
		methods := "*"
		if r.action == "upgrade" {
			r.methods = rapid.SliceOfNDistinct(rapid.SampledFrom([]string{"GET", "HEAD"}), 1, 2, rapid.ID).Draw(t, "methods")
			methods = strings.Join(r.methods, ",")
		} else if rapid.Bool().Draw(t, "somemethods") {
			r.methods = rapid.SliceOfNDistinct(rapid.SampledFrom(ruleMethods), 1, 3, rapid.ID).Draw(t, "methods")
			methods = strings.Join(r.methods, ",")
		}
		var pattern string
		var vars []string
		n := rapid.IntRange(1, 3).Draw(t, "patlen")
		for i := 0; i < n; i++ {
			kind := rapid.IntRange(0, 2).Draw(t, "patseg")
			switch {
			case kind == 2 && i == n-1:
				name := fmt.Sprintf("v%d", i)
				r.segs = append(r.segs, mPatSeg{name: name, rest: true})
				pattern += "/{" + name + "...}"
				vars = append(vars, name)
			case kind >= 1:
				name := fmt.Sprintf("v%d", i)
				r.segs = append(r.segs, mPatSeg{name: name})
				pattern += "/{" + name + "}"
				vars = append(vars, name)
			default:
				l := rapid.SampledFrom(ruleLits).Draw(t, "lit")
				r.segs = append(r.segs, mPatSeg{lit: l.dec})
				pattern += "/" + l.raw
			}
		}
		action := r.action
		switch r.action {
		case "fence":
			tmpl := rapid.SampledFrom([]string{"r", "job:", "x-"}).Draw(t, "tmplprefix")
			r.tmpl = append(r.tmpl, mPatSeg{lit: tmpl})
			for _, v := range vars {
				if rapid.Bool().Draw(t, "usevar") {
					r.tmpl = append(r.tmpl, mPatSeg{name: v})
					tmpl += "{" + v + "}"
				}
			}
			if r.strict {
				action += " strict"
			}
			action += " " + tmpl
		case "upgrade":
			r.protos = rapid.SliceOfNDistinct(rapid.SampledFrom([]string{"websocket", "foo"}), 1, 2, rapid.ID).Draw(t, "protos")
			action += " " + strings.Join(r.protos, ",")
		}
		r.text = methods + " " + pattern + " " + action
		return r
	})
}

// match is the model's rule matching: method in the set, and the decoded
// segments against the pattern, a {name} taking one non-empty segment and
// a {name...} the rest of the path.
func (r *mRule) match(method string, segs []string) (map[string]string, bool) {
	if r.methods != nil && !slices.Contains(r.methods, method) {
		return nil, false
	}
	vars := map[string]string{}
	for i, ps := range r.segs {
		if i >= len(segs) {
			return nil, false
		}
		switch {
		case ps.rest:
			vars[ps.name] = strings.Join(segs[i:], "/")
			return vars, true
		case ps.name != "":
			if segs[i] == "" {
				return nil, false
			}
			vars[ps.name] = segs[i]
		case segs[i] != ps.lit:
			return nil, false
		}
	}
	return vars, len(segs) == len(r.segs)
}

func (r *mRule) resource(vars map[string]string) string {
	var b strings.Builder
	for _, p := range r.tmpl {
		if p.name != "" {
			b.WriteString(vars[p.name])
		} else {
			b.WriteString(p.lit)
		}
	}
	return b.String()
}

// validResource: 1 to MaxNameBytes bytes of A-Z a-z 0-9 . _ : ~ -.
func validResource(s string) bool {
	if s == "" || len(s) > fencing.MaxNameBytes {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._:~-", c) >= 0) {
			return false
		}
	}
	return true
}

// mRequest is a generated request and what the model knows about it.
type mRequest struct {
	in             Incoming
	originForm     bool // the target is a path (not absolute-form, "*" or empty)
	path           mPath
	methodOverride bool
	pathOverride   bool
	upgrade        bool     // asks for a protocol upgrade
	protos         []string // the protocols asked for, lower case
	dest           *mDest
}

type mDest struct {
	values []string
	ok     bool // one value, a path or a URL on this host, no query
	path   mPath
}

type query struct {
	q        string
	override bool
}

type override struct {
	key, value   string
	method, path bool
}

type mUpgrade struct {
	header map[string]string
	asked  bool
	protos []string
}

var (
	queries = []query{{"?a=%2F;b", false}, {"?_methodx=1", false},
		{"?_method=PUT", true}, {"?x=1&_METHOD=DELETE", true}, {"?%5Fmethod=x", true}, {"?a=1;_method", true}, {"?x=1", false},
		// As PHP reads names: _method to Symfony and Laravel.
		{"?.method=DELETE", true}, {"?%2Emethod=x", true}, {"?[method=x", true}, {"?%20method=x", false}, {"?%20_method=x", true}, {"?_method[]=x", true}, {"?_method%00x=1", true},
		{"?_method[x=1", false}, {"?a.method=1", false}}
	overrides = []override{{"X-Http-Method-Override", "PUT", true, false}, {"X-Http-Method", "DELETE", true, false},
		{"X-Method-Override", "GET", true, false}, {"X_http_method_override", "PUT", true, false},
		{"X-Original-Url", "/admin", false, true}, {"X-Rewrite-Url", "/x", false, true},
		{"X-Http-Method-Overrides", "PUT", false, false}, {"X-Forwarded-For", "192.0.2.1", false, false}}
	upgrades = []mUpgrade{
		{map[string]string{"Upgrade": "websocket", "Connection": "Upgrade"}, true, []string{"websocket"}},
		{map[string]string{"Upgrade": "WebSocket/13"}, true, []string{"websocket"}},
		{map[string]string{"Upgrade": "h2c", "Connection": "Upgrade, HTTP2-Settings"}, true, []string{"h2c"}},
		{map[string]string{"Upgrade": "h2c, websocket"}, true, []string{"h2c", "websocket"}},
		{map[string]string{"Upgrade": "foo"}, true, []string{"foo"}},
		{map[string]string{"Connection": "keep-alive, upgrade"}, true, nil},
		{map[string]string{"Upgrade": " , "}, true, []string{""}},
		{header: map[string]string{"Connection": "keep-alive"}},
	}
	tokens    = [][]string{{"1"}, nil, {"42"}, {"18446744073709551615"}, {"18446744073709551616"}, {"0"}, {"007"}, {"-1"}, {""}, {"abc"}, {"+1"}, {"1", "2"}, {"1", "1"}, {"7"}}
	resources = [][]string{nil, {"hdr"}, {"bad name"}, {"a", "b"}, {""}}
)

func requestGen() *rapid.Generator[mRequest] {
	return rapid.Custom(func(t *rapid.T) mRequest {
		var r mRequest
		r.in.Method = rapid.SampledFrom(reqMethods).Draw(t, "method")
		r.in.Host = "gate"
		r.in.Header = http.Header{}
		r.path = pathGen().Draw(t, "path")
		var q query
		if rapid.IntRange(0, 4).Draw(t, "hasquery") == 4 {
			q = rapid.SampledFrom(queries).Draw(t, "query")
		}
		r.methodOverride = q.override
		switch rapid.IntRange(0, 19).Draw(t, "form") {
		case 18:
			r.in.Target = "http://gate" + r.path.raw + q.q
		case 19:
			r.in.Target, r.methodOverride = "*", false
		default:
			r.in.Target, r.originForm = r.path.raw+q.q, true
		}
		var os []override
		if rapid.IntRange(0, 9).Draw(t, "hasoverrides") == 9 {
			os = rapid.SliceOfN(rapid.SampledFrom(overrides), 1, 2).Draw(t, "overrides")
		}
		for _, o := range os {
			r.in.Header[o.key] = []string{o.value}
			r.methodOverride = r.methodOverride || o.method
			r.pathOverride = r.pathOverride || o.path
		}
		var u mUpgrade
		if rapid.IntRange(0, 5).Draw(t, "hasupgrade") == 5 {
			u = rapid.SampledFrom(upgrades).Draw(t, "upgrade")
		}
		for k, v := range u.header {
			r.in.Header[k] = []string{v}
		}
		r.upgrade, r.protos = u.asked, u.protos
		tok := []string{"1"}
		if rapid.IntRange(0, 2).Draw(t, "oddtoken") == 2 {
			tok = rapid.SampledFrom(tokens).Draw(t, "token")
		}
		if tok != nil {
			r.in.Header[HeaderToken] = tok
		}
		if res := rapid.SampledFrom(resources).Draw(t, "resource"); res != nil {
			r.in.Header[HeaderResource] = res
		}
		if dt := rapid.SampledFrom(append([][]string{{"2"}, {"1"}}, tokens...)).Draw(t, "desttoken"); dt != nil {
			r.in.Header[HeaderDestinationToken] = dt
		}
		if rapid.IntRange(0, 5).Draw(t, "hasdest") == 5 {
			d := &mDest{path: pathGen().Draw(t, "destpath"), ok: true}
			prefix := rapid.SampledFrom([]string{"", "", "http://gate", "HTTP://GATE", "https://upstream:1", "http://other", "gate"}).Draw(t, "destform")
			if prefix == "http://other" || prefix == "gate" {
				d.ok = false
			}
			v := prefix + d.path.raw
			if rapid.IntRange(0, 5).Draw(t, "destquery") == 5 {
				v += "?x"
				d.ok = false
			}
			if strings.ContainsAny(d.path.raw, "#") {
				d.ok = false // a fragment
			}
			d.values = []string{v}
			if rapid.IntRange(0, 5).Draw(t, "twodests") == 5 {
				d.values = append(d.values, "/a")
				d.ok = false
			}
			r.in.Header[HeaderDestination] = d.values
			r.dest = d
		}
		return r
	})
}

// mDecision is the model's verdict: Forward (unfenced), Fence on targets
// with token, or Refuse with code.
type mDecision struct {
	verdict  Verdict
	code     string
	token    fencing.Token
	targets  []Target
	unfenced bool
}

func modelSafe(m string) bool { return slices.Contains([]string{"GET", "HEAD", "OPTIONS", "TRACE"}, m) }

func refuse(code string) mDecision { return mDecision{verdict: Refuse, code: code} }

// model states DESIGN §4 and decide's contract for one request.
func model(rules []mRule, resourceHeader bool, r mRequest) mDecision {
	canon := r.originForm && r.path.canon
	route := func(segs []string, upgrade bool) (*mRule, map[string]string) {
		for i := range rules {
			if (rules[i].action == "upgrade") != upgrade {
				continue
			}
			if vars, ok := rules[i].match(r.in.Method, segs); ok {
				return &rules[i], vars
			}
		}
		return nil, nil
	}
	switch {
	case r.methodOverride:
		return refuse("method-override-denied")
	case r.pathOverride:
		return refuse("path-not-canonical")
	case r.in.Method == "CONNECT" || r.in.Method == "PRI":
		return refuse("upgrade-denied")
	case r.upgrade:
		switch {
		case !modelSafe(r.in.Method):
			return refuse("upgrade-denied")
		case len(r.protos) > 0 && !slices.ContainsFunc(r.protos, func(p string) bool { return p != "h2c" }):
			return mDecision{verdict: Forward}
		case !canon:
			return refuse("path-not-canonical")
		case len(r.protos) == 0:
			return refuse("upgrade-denied")
		}
		rule, _ := route(r.path.segs, true)
		if rule == nil {
			return refuse("upgrade-denied")
		}
		for _, p := range r.protos {
			if !slices.Contains(rule.protos, p) {
				return refuse("upgrade-denied")
			}
		}
		return mDecision{verdict: Forward}
	case modelSafe(r.in.Method):
		return mDecision{verdict: Forward}
	case !canon:
		return refuse("path-not-canonical")
	}
	rule, vars := route(r.path.segs, false)
	if rule != nil && rule.action == "deny" {
		return refuse("write-denied")
	}
	var dest *mRule
	var destVars map[string]string
	if r.dest != nil {
		if !r.dest.ok || !r.dest.path.canon {
			return refuse("path-not-canonical")
		}
		if dest, destVars = route(r.dest.path.segs, false); dest == nil {
			return refuse("resource-required")
		} else if dest.action == "deny" {
			return refuse("write-denied")
		}
	}
	sourcePass := rule != nil && rule.action == "pass"
	destFenced := dest != nil && dest.action == "fence"
	if sourcePass && !destFenced {
		return mDecision{verdict: Forward, unfenced: true}
	}
	// token reads one token header as DESIGN §4 says.
	token := func(name string) (fencing.Token, string) {
		tok := r.in.Header[name]
		switch {
		case len(tok) == 0:
			return 0, "token-required"
		case len(tok) > 1 || tok[0] == "" || tok[0][0] == '0' || tok[0][0] == '+':
			return 0, "invalid-token"
		}
		n, err := strconv.ParseUint(tok[0], 10, 64)
		if err != nil {
			return 0, "invalid-token"
		}
		return fencing.Token(n), ""
	}
	d := mDecision{verdict: Fence}
	if !sourcePass {
		t, code := token(HeaderToken)
		if code != "" {
			return refuse(code)
		}
		d.token = t
		var res string
		if rule != nil {
			res = rule.resource(vars)
			if !validResource(res) {
				return refuse("resource-required")
			}
		} else {
			h := r.in.Header[HeaderResource]
			if !resourceHeader || len(h) != 1 || !validResource(h[0]) {
				return refuse("resource-required")
			}
			res = h[0]
		}
		d.targets = append(d.targets, Target{Resource: res, Token: t, Strict: rule != nil && rule.strict})
	}
	if destFenced {
		res := dest.resource(destVars)
		if !validResource(res) {
			return refuse("resource-required")
		}
		if len(d.targets) == 1 && d.targets[0].Resource == res {
			d.targets[0].Strict = d.targets[0].Strict || dest.strict
		} else {
			// Another resource: its own token, never the source's.
			t, code := token(HeaderDestinationToken)
			if code != "" {
				return refuse(code)
			}
			if sourcePass {
				d.token = t
			}
			d.targets = append(d.targets, Target{Resource: res, Token: t, Strict: dest.strict})
		}
	}
	slices.SortFunc(d.targets, func(a, b Target) int { return strings.Compare(a.Resource, b.Resource) })
	return d
}

var verdictName = map[Verdict]string{Forward: "forward", Fence: "fence", Refuse: "refuse"}

// decideFunc is the decision under test: Gate.decide, or a broken wrapper
// of it that the property must catch.
type decideFunc func(*Gate, Incoming) Decision

// decideProperty draws a rule set, the resource-header setting and a
// request, and checks the decision against the model and the promises of
// DESIGN §4 it implies.
func decideProperty(decide decideFunc) func(*rapid.T) {
	store := memstore.New(memstore.Options{}) // never consulted
	up, _ := url.Parse("http://upstream:1")
	return func(t *rapid.T) {
		mrules := rapid.SliceOfN(ruleGen(), 0, 4).Draw(t, "rules")
		var text []string
		for _, r := range mrules {
			text = append(text, r.text)
		}
		rules, err := ParseRules(strings.Join(text, "\n"))
		if err != nil {
			t.Fatalf("generated rules do not parse: %v", err)
		}
		header := rapid.Bool().Draw(t, "resourceHeader")
		g, err := New(Options{Upstream: up, Store: store, Rules: rules, ResourceHeader: header})
		if err != nil {
			t.Fatal(err)
		}
		r := requestGen().Draw(t, "request")
		if r.originForm && r.path.canon {
			// The model's decoding is the RFC 3986 upstream's.
			if once, ok := upstreamResolves(r.in.Target); !ok || once != "/"+strings.Join(r.path.segs, "/") {
				t.Fatalf("%q: the model decodes %q, an upstream resolves %q", r.in.Target, r.path.segs, once)
			}
		}
		got := decide(g, r.in)
		want := model(mrules, header, r)

		desc := fmt.Sprintf("rules %q, resource header %v: %s %q headers %v", text, header, r.in.Method, r.in.Target, r.in.Header)
		code := ""
		if got.Problem != nil {
			code = got.Problem.Code
		}
		// The promises, stated on their own so a failure names the one
		// broken.
		safe := modelSafe(r.in.Method)
		switch {
		case got.Verdict == Refuse && got.Problem == nil:
			t.Fatalf("%s: refused without a problem", desc)
		case got.Verdict != Refuse && got.Problem != nil:
			t.Fatalf("%s: %s with problem %v", desc, verdictName[got.Verdict], got.Problem)
		case safe && got.Verdict == Fence:
			t.Fatalf("%s: a safe method fenced", desc)
		case safe && !r.upgrade && !r.methodOverride && !r.pathOverride && got.Verdict != Forward:
			t.Fatalf("%s: a plain safe request refused: %v", desc, got.Problem)
		case !safe && got.Verdict != Refuse && !(r.originForm && r.path.canon):
			t.Fatalf("%s: a write to a non-canonical target forwarded (%+v)", desc, got)
		case !safe && got.Verdict != Refuse && (r.methodOverride || r.upgrade):
			t.Fatalf("%s: a write with a method override or upgrade forwarded (%+v)", desc, got)
		case got.Verdict == Refuse && !slices.Contains([]string{"path-not-canonical", "upgrade-denied",
			"method-override-denied", "token-required", "invalid-token", "resource-required", "write-denied"}, code):
			t.Fatalf("%s: refused with undocumented code %q", desc, code)
		}
		if got.Verdict != want.verdict || code != want.code {
			t.Fatalf("%s:\ngate decides %s %v\nmodel says   %s %s", desc, verdictName[got.Verdict], got.Problem, verdictName[want.verdict], want.code)
		}
		if got.Verdict == Forward && !safe && got.Unfenced != want.unfenced {
			t.Fatalf("%s: forwarded unfenced=%v, model says %v", desc, got.Unfenced, want.unfenced)
		}
		if got.Verdict == Fence && (got.Token != want.token || !slices.Equal(got.Targets, want.targets)) {
			t.Fatalf("%s:\ngate fences %v with token %d\nmodel says   %v with token %d", desc, got.Targets, got.Token, want.targets, want.token)
		}
	}
}

// moreChecks raises rapid's number of checks to n for this test, unless
// -rapid.checks was given: most random requests are refused early, and a
// check takes well under a millisecond.
func moreChecks(t *testing.T, n int) {
	f := flag.Lookup("rapid.checks")
	if old := f.Value.String(); old == f.DefValue {
		if err := flag.Set("rapid.checks", strconv.Itoa(n)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = flag.Set("rapid.checks", old) })
	}
}

// TestDecideModel checks the gate's decision function against the model.
func TestDecideModel(t *testing.T) {
	moreChecks(t, 1000)
	rapid.Check(t, decideProperty((*Gate).decide))
}

// checkFails runs the property on a broken decision and requires that it
// fails, leaving no rapid fail file behind.
func checkFails(t *testing.T, decide decideFunc) {
	t.Helper()
	moreChecks(t, 1000)
	old := flag.Lookup("rapid.nofailfile").Value.String()
	if err := flag.Set("rapid.nofailfile", "true"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set("rapid.nofailfile", old) })
	rec := failrecorder.New(t)
	rapid.Check(rec, decideProperty(decide))
	if !rec.Failed() {
		t.Fatal("the property did not catch a broken decision")
	}
	t.Logf("caught, shrunk:\n%s", rec.Report())
}

// TestDecideModelCatchesCaseFolding: a gate that matched methods case-
// insensitively would fence "put" under a PUT rule's resource.
func TestDecideModelCatchesCaseFolding(t *testing.T) {
	checkFails(t, func(g *Gate, in Incoming) Decision {
		in.Method = strings.ToUpper(in.Method)
		return g.decide(in)
	})
}

// TestDecideModelCatchesEncodedSlash: a gate that decoded %2F before
// judging the path would forward a write to a path an upstream may
// resolve differently.
func TestDecideModelCatchesEncodedSlash(t *testing.T) {
	checkFails(t, func(g *Gate, in Incoming) Decision {
		in.Target = strings.ReplaceAll(strings.ReplaceAll(in.Target, "%2F", "/"), "%2f", "/")
		return g.decide(in)
	})
}
