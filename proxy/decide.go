package proxy

import (
	"cmp"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
)

// HeaderDestination names the second target of a WebDAV COPY or MOVE
// (RFC 4918 §10.3). The gate fences a write on its Destination too.
const HeaderDestination = "Destination"

// HeaderDestinationToken carries the token of a COPY or MOVE's
// Destination resource when that is another resource than the source's:
// each resource's writes are fenced by that resource's own tokens, which
// are not comparable across resources.
const HeaderDestinationToken = "Fencing-Destination-Token"

// methodOverrideHeaders are headers some frameworks honour to replace the
// request's method (a POST becomes a DELETE, a GET a PUT). The gate judges
// the method as sent, so it refuses any request that carries one.
var methodOverrideHeaders = []string{"x-http-method-override", "x-http-method", "x-method-override"}

// pathOverrideHeaders are headers some servers honour to replace the
// request's path (IIS URL Rewrite, older Symfony and Zend). The gate judges
// the path as sent, so it refuses any request that carries one.
var pathOverrideHeaders = []string{"x-original-url", "x-rewrite-url"}

// methodParam is the query parameter some frameworks (Symfony, Laravel)
// honour to replace a POST's method.
const methodParam = "_method"

// Verdict is what the gate does with a request.
type Verdict int

// The verdicts of a Decision.
const (
	// Forward: forward the request without fencing it (a safe method, an
	// allowed upgrade, or a write under a pass rule).
	Forward Verdict = iota + 1
	// Fence: forward the request only if Token is admitted on every
	// target, after the barrier lets it through on each.
	Fence
	// Refuse: answer with the Decision's problem; nothing is forwarded.
	Refuse
)

// Target is one resource a fenced write is checked against, with the
// token it is checked with.
type Target struct {
	Resource string
	// Token is the token admitted on Resource: the Fencing-Token, or for
	// a Destination on another resource the Fencing-Destination-Token.
	Token fencing.Token
	// Strict also requires Token to hold the live lease on Resource.
	Strict bool
}

// Incoming is the shape of a request as the client sent it: all the gate's
// decision depends on.
type Incoming struct {
	// Method is the method as sent: case matters ("put" is not "PUT").
	Method string
	// Target is the request target as sent (the raw request-URI).
	Target string
	// Host is the Host header.
	Host string
	// Header holds the other request headers, keys in canonical form.
	Header http.Header

	// targets, when not nil, is where the decision's Targets are
	// appended (an exchange's own array: one allocation less a write).
	targets []Target
}

// Decision is the gate's judgement of a request, made from its shape alone
// (see Gate.decide): no store, barrier or upstream is consulted.
type Decision struct {
	Verdict Verdict
	// Problem says why (Refuse only).
	Problem *problem.Error
	// Rule is the rule that matched the request's own path, if any.
	Rule *Rule
	// Unfenced marks a write (unsafe method) forwarded without a check
	// because a pass rule said so (Forward only).
	Unfenced bool
	// DropUpgrade: forward the read without its Upgrade header, as plain
	// HTTP/1.1 (Forward only). For an h2c offer on a read, which a server
	// may ignore (RFC 9110 §7.8), as curl --http2 sends on http:// URLs.
	DropUpgrade bool
	// Token is the write's fencing token (Fence only): the Fencing-Token,
	// or the destination's token when only the Destination is fenced.
	Token fencing.Token
	// Targets are the resources the write is fenced on (Fence only): one,
	// or two for a write whose Destination is another resource; distinct
	// and in resource order, the order they are admitted and ordered in.
	Targets []Target
	// Destination is the Destination value the upstream gets instead of
	// the client's, "" for the client's own: with a base path in the
	// upstream's URL, the judged path under that base, as the request's
	// own path is, so that the upstream changes the resource the gate
	// fenced (a Destination left as sent would name a path outside it).
	Destination string
}

func refusal(status int, code, detail string) Decision {
	return Decision{Verdict: Refuse, Problem: problem.New(status, code, detail)}
}

// decide is the gate's contract for one request, read top to bottom:
//
//  1. A method-override header or _method query parameter is refused (403
//     method-override-denied), and a path-override header (400
//     path-not-canonical), whatever the method: the upstream might apply
//     another method or path than the one judged.
//  2. CONNECT and the HTTP/2 preface (PRI) are refused (403
//     upgrade-denied); so is a protocol upgrade, unless the method is safe,
//     the path canonical and an upgrade rule allows every protocol asked.
//     A read that offers only h2c is forwarded without the offer.
//  3. Other safe methods are forwarded unfenced.
//  4. An unsafe request whose target is not a canonical origin-form path
//     is refused (400 path-not-canonical), before any rule is consulted.
//  5. The first rule matching the method and path decides: deny (403
//     write-denied), pass, or fence on the rule's resource. No rule: the
//     Fencing-Resource header names the resource if ResourceHeader is on,
//     otherwise 400 resource-required (a write without a token is refused
//     428 token-required before that: the token is looked at first).
//  6. A Destination header is judged the same way (same method, its own
//     path, canonical, on this host): deny refuses the write, fence adds
//     a second target, pass adds none, and no rule refuses (the resource
//     header never names a second target).
//  7. A write with no target left is forwarded unfenced (pass rules).
//     Otherwise its source needs one Fencing-Token, and a Destination on
//     another resource one Fencing-Destination-Token (428 token-required,
//     400 invalid-token): each target is admitted with its own token.
//
// Before all of these, a Host header that is not a plain host[:port] (a
// name, an IPv4 address or a bracketed IPv6 address) is refused (400
// invalid-request), on every method: an upstream that builds URLs or
// routes from Host could read it as a path.
func (g *Gate) decide(in Incoming) Decision {
	if !ValidHost(in.Host) {
		return refusal(http.StatusBadRequest, "invalid-request",
			fmt.Sprintf("Host %q is not a host name, IPv4 address or [IPv6] address with an optional port", truncate(in.Host)))
	}
	suspect := suspectHeaders(in.Header)
	if name := suspect.methodOverride; name != "" || queryHasMethod(in.Target) {
		if name == "" {
			name = "a " + methodParam + " query parameter"
		}
		return refusal(http.StatusForbidden, "method-override-denied",
			fmt.Sprintf("the gate judges a request by the method it was sent with, and an upstream may honour %s instead: send the method itself", name))
	}
	if name := suspect.pathOverride; name != "" {
		return refusal(http.StatusBadRequest, "path-not-canonical",
			fmt.Sprintf("the gate judges a request by the path it was sent to, and an upstream may honour %s instead: send the path itself", name))
	}
	if in.Method == http.MethodConnect || in.Method == "PRI" {
		return refusal(http.StatusForbidden, "upgrade-denied",
			in.Method+" would open a tunnel past the gate; the gate forwards HTTP/1.1 requests only")
	}
	if protos, ok := upgradeRequested(in.Header); ok {
		return g.decideUpgrade(in, protos)
	}
	if safeMethod(in.Method) {
		return Decision{Verdict: Forward}
	}
	if name := suspect.fencingAlias; name != "" {
		return refusal(http.StatusBadRequest, "invalid-request",
			fmt.Sprintf("header %q: an upstream may read it as the fencing header of that name, which the gate judges spelt with hyphens only; send that one alone", truncate(name)))
	}

	var segBuf [8]string // the path's segments, without allocating for most paths
	segs, p := canonicalSegments(in.Target, segBuf[:0])
	if p != nil {
		return Decision{Verdict: Refuse, Problem: p}
	}
	d := Decision{Verdict: Fence, Targets: in.targets}
	// One rule set for the whole decision: a reload between the source's
	// route and the Destination's would judge them by two sets (a source
	// passed by the old, a Destination by the new), which neither allows.
	rules := g.Rules()
	if g.afterRulesLoad != nil {
		g.afterRulesLoad()
	}
	var buf, destBuf [4]pathVar // the rules' variables, without allocating
	rule, vars := route(rules, in.Method, segs, buf[:0])
	d.Rule = rule
	if rule != nil && rule.Action == ActionDeny {
		return denied(rule, in.Method)
	}
	var dest *Rule
	var destVars pathVars
	if vs, ok := in.Header[HeaderDestination]; ok {
		var p *problem.Error
		var path string
		if dest, destVars, path, p = g.routeDestination(rules, in, vs, destBuf[:0]); p != nil {
			return Decision{Verdict: Refuse, Problem: p, Rule: rule}
		}
		if g.upstreamBase != "" {
			d.Destination = g.upstreamBase + path
		}
	}
	sourcePass := rule != nil && rule.Action == ActionPass
	destFenced := dest != nil && dest.Action == ActionFence
	if sourcePass && !destFenced {
		return Decision{Verdict: Forward, Rule: rule, Unfenced: true, Destination: d.Destination}
	}

	if !sourcePass {
		token, p := requestToken(in.Header, HeaderToken)
		if p != nil {
			return Decision{Verdict: Refuse, Problem: p, Rule: rule}
		}
		res, p := g.resource(in.Header, rule, vars, len(rules))
		if p != nil {
			return Decision{Verdict: Refuse, Problem: p, Rule: rule}
		}
		d.Token = token
		d.Targets = append(d.Targets, Target{Resource: res, Token: token, Strict: rule != nil && rule.Strict})
	}
	if destFenced {
		res, p := ruleResource(dest, destVars)
		if p != nil {
			p.Detail = "Destination: " + p.Detail
			return Decision{Verdict: Refuse, Problem: p, Rule: rule}
		}
		if len(d.Targets) == 1 && d.Targets[0].Resource == res {
			d.Targets[0].Strict = d.Targets[0].Strict || dest.Strict // one resource, one token
		} else {
			token, p := requestToken(in.Header, HeaderDestinationToken)
			if p != nil {
				p.Detail = "the Destination is resource " + strconv.Quote(res) + ", fenced by its own tokens: " + p.Detail
				return Decision{Verdict: Refuse, Problem: p, Rule: rule}
			}
			if sourcePass {
				d.Token = token
			}
			d.Targets = append(d.Targets, Target{Resource: res, Token: token, Strict: dest.Strict})
		}
	}
	slices.SortFunc(d.Targets, func(a, b Target) int { return cmp.Compare(a.Resource, b.Resource) })
	return d
}

func denied(rule *Rule, method string) Decision {
	return Decision{Verdict: Refuse, Rule: rule, Problem: problem.New(http.StatusForbidden, "write-denied",
		fmt.Sprintf("route rule on line %d denies %s %s", rule.Line, method, rule.Pattern))}
}

// canonicalSegments checks an unsafe request's target and returns its
// path's decoded segments.
func canonicalSegments(target string, into []string) ([]string, *problem.Error) {
	path, err := originPath(target)
	if err == nil {
		err = CheckPath(path)
	}
	if err != nil {
		return nil, notCanonical(err)
	}
	segs, err := appendSegments(into, path)
	if err != nil { // CheckPath lets no such path through
		return nil, notCanonical(err)
	}
	return segs, nil
}

func notCanonical(err error) *problem.Error {
	return problem.New(http.StatusBadRequest, "path-not-canonical",
		"the gate forwards writes only to canonical paths, which every upstream resolves alike: "+err.Error())
}

// route returns the first fence, pass or deny rule of rules matching
// method and the path's segments, and its pattern variables.
func route(rules []Rule, method string, segs []string, into pathVars) (*Rule, pathVars) {
	for i := range rules {
		if rules[i].Action == ActionUpgrade {
			continue
		}
		if vars, ok := rules[i].match(method, segs, into); ok {
			return &rules[i], vars
		}
	}
	return nil, nil
}

// routeDestination judges a write's Destination header: one value, a path
// or an http(s) URL on the request's host (or the upstream's), canonical,
// matched by a rule of rules that does not deny it. It returns the rule,
// its variables and the Destination's path, as judged.
func (g *Gate) routeDestination(rules []Rule, in Incoming, vs []string, into pathVars) (*Rule, pathVars, string, *problem.Error) {
	if len(vs) != 1 {
		return nil, nil, "", problem.New(http.StatusBadRequest, "path-not-canonical", "send at most one Destination header")
	}
	path, err := g.destinationPath(in.Host, vs[0])
	if err == nil {
		err = CheckPath(path)
	}
	if err != nil {
		p := notCanonical(err)
		p.Detail = "Destination: " + p.Detail
		return nil, nil, "", p
	}
	segs, err := splitPath(path)
	if err != nil {
		return nil, nil, "", notCanonical(err)
	}
	rule, vars := route(rules, in.Method, segs, into)
	switch {
	case rule == nil:
		return nil, nil, "", problem.New(http.StatusBadRequest, "resource-required",
			"no route rule matches the Destination, so the gate cannot tell which resource it changes; a Destination is fenced only by a rule")
	case rule.Action == ActionDeny:
		return nil, nil, "", denied(rule, in.Method).Problem
	}
	return rule, vars, path, nil
}

// destinationPath returns the path of a Destination value: an absolute
// path, or an http or https URL whose authority is host or the upstream's.
// Queries and fragments are refused.
func (g *Gate) destinationPath(host, v string) (string, error) {
	if strings.ContainsAny(v, "?#") {
		return "", fmt.Errorf("%q has a query or fragment", truncate(v))
	}
	if strings.HasPrefix(v, "/") {
		return v, nil
	}
	rest, ok := cutPrefixFold(v, "http://")
	if !ok {
		if rest, ok = cutPrefixFold(v, "https://"); !ok {
			return "", fmt.Errorf("%q is neither a path nor an http(s) URL", truncate(v))
		}
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return "", fmt.Errorf("%q has no path", truncate(v))
	}
	authority := rest[:i]
	if authority == "" || !(strings.EqualFold(authority, host) || strings.EqualFold(authority, g.upstream.Host)) {
		return "", fmt.Errorf("%q names another host than this request's", truncate(v))
	}
	return rest[i:], nil
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return s, false
}

// decideUpgrade judges a request that asks for a protocol upgrade.
func (g *Gate) decideUpgrade(in Incoming, protos []string) Decision {
	if !safeMethod(in.Method) {
		return refusal(http.StatusForbidden, "upgrade-denied",
			"a write may not upgrade its connection: the tunnel would carry later bytes past the gate's fencing")
	}
	if len(protos) > 0 && !slices.ContainsFunc(protos, func(p string) bool { return p != "h2c" }) {
		return Decision{Verdict: Forward, DropUpgrade: true}
	}
	segs, p := canonicalSegments(in.Target, nil)
	if p != nil {
		return Decision{Verdict: Refuse, Problem: p}
	}
	if len(protos) == 0 {
		return refusal(http.StatusForbidden, "upgrade-denied", "Connection: upgrade without an Upgrade protocol")
	}
	rules := g.Rules()
	for i := range rules {
		r := &rules[i]
		if r.Action != ActionUpgrade {
			continue
		}
		if _, ok := r.match(in.Method, segs, nil); !ok {
			continue
		}
		for _, p := range protos {
			if !slices.Contains(r.Protocols, p) {
				return Decision{Verdict: Refuse, Rule: r, Problem: problem.New(http.StatusForbidden, "upgrade-denied",
					fmt.Sprintf("route rule on line %d allows upgrades to %s only, not %q", r.Line, strings.Join(r.Protocols, ","), p))}
			}
		}
		return Decision{Verdict: Forward, Rule: r}
	}
	return refusal(http.StatusForbidden, "upgrade-denied",
		"no upgrade rule allows a protocol upgrade here (e.g. \"GET /ws/{rest...} upgrade websocket\")")
}

// upgradeRequested reports whether h asks for a protocol upgrade (an
// Upgrade header, or "upgrade" among the Connection options) and returns
// the protocol names asked for, lower case and without versions.
func upgradeRequested(h http.Header) ([]string, bool) {
	asked := false
	for _, v := range h["Connection"] {
		for _, opt := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(opt), "upgrade") {
				asked = true
			}
		}
	}
	ups, ok := h["Upgrade"]
	if !ok && !asked {
		return nil, false
	}
	var protos []string
	for _, v := range ups {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				name, _, _ := strings.Cut(p, "/") // "websocket", "HTTP/2.0"
				protos = append(protos, strings.ToLower(name))
			}
		}
	}
	if len(ups) > 0 && len(protos) == 0 {
		protos = []string{""} // an empty Upgrade header names no allowed protocol
	}
	return protos, true
}

// fencingNames are the names of the headers the gate judges a write by,
// in lower case.
var fencingNames = []string{"fencing-token", "fencing-resource", "fencing-destination-token"}

// suspects are the names of headers of a request that an upstream might
// honour in place of what the gate judges, one of each kind ("" for none).
type suspects struct {
	// methodOverride is one of methodOverrideHeaders, pathOverride one of
	// pathOverrideHeaders, in any spelling an upstream might normalize to
	// it ("_" for "-", any case).
	methodOverride, pathOverride string
	// fencingAlias is a fencing header spelt with underscores for hyphens
	// (Fencing_Token). CGI, WSGI, Rack and PHP servers map both spellings
	// to one variable (HTTP_FENCING_TOKEN) and may hand the application
	// the value the gate did not judge.
	fencingAlias string
}

// suspectHeaders finds h's suspects in one walk over its names.
func suspectHeaders(h http.Header) suspects {
	var s suspects
	for k := range h {
		if len(k) < min(len("x-http-method"), len("fencing-token")) {
			continue
		}
		switch k[0] {
		case 'X', 'x':
			n := strings.ToLower(strings.ReplaceAll(k, "_", "-"))
			switch {
			case slices.Contains(methodOverrideHeaders, n):
				s.methodOverride = cmp.Or(s.methodOverride, k)
			case slices.Contains(pathOverrideHeaders, n):
				s.pathOverride = cmp.Or(s.pathOverride, k)
			}
		case 'F', 'f':
			if strings.IndexByte(k, '_') >= 0 && slices.Contains(fencingNames, strings.ToLower(strings.ReplaceAll(k, "_", "-"))) {
				s.fencingAlias = cmp.Or(s.fencingAlias, k)
			}
		}
	}
	return s
}

// queryHasMethod reports whether target's query has a _method parameter,
// its name decoded, in any case, and as PHP reads it (phpParamName: PHP
// frameworks read the override); "&" and ";" both separate parameters.
func queryHasMethod(target string) bool {
	_, q, ok := strings.Cut(target, "?")
	if !ok || len(q) < len(methodParam) {
		return false
	}
	for q != "" {
		var kv string
		if i := strings.IndexAny(q, "&;"); i >= 0 {
			kv, q = q[:i], q[i+1:]
		} else {
			kv, q = q, ""
		}
		k, _, _ := strings.Cut(kv, "=")
		if d, err := url.QueryUnescape(k); err == nil {
			k = d
		}
		if strings.EqualFold(strings.TrimSpace(k), methodParam) || strings.EqualFold(phpParamName(k), methodParam) {
			return true
		}
	}
	return false
}

// phpParamName is the name PHP gives a decoded query parameter name: cut
// at a NUL (a C string), its leading spaces dropped, an array's brackets
// cut ("_method[]" is _method), an unmatched "[" made "_", and spaces,
// dots and the bytes 0x80 to 0x9F made "_" (".method", "[method" and
// " _method" are all _method to Symfony and Laravel).
func phpParamName(k string) string {
	if i := strings.IndexByte(k, 0); i >= 0 {
		k = k[:i]
	}
	k = strings.TrimLeft(k, " ")
	if i := strings.IndexByte(k, '['); i >= 0 {
		if strings.IndexByte(k[i:], ']') > 0 {
			k = k[:i]
		} else {
			k = k[:i] + "_" + k[i+1:]
		}
	}
	b := []byte(k)
	for i, c := range b {
		if c == ' ' || c == '.' || c >= 0x80 && c <= 0x9f {
			b[i] = '_'
		}
	}
	return string(b)
}

// requestToken reads a write's token from header name (HeaderToken, or
// HeaderDestinationToken).
func requestToken(h http.Header, name string) (fencing.Token, *problem.Error) {
	vs := h[name]
	switch len(vs) {
	case 0:
		return 0, problem.New(http.StatusPreconditionRequired, "token-required",
			"a write needs a "+name+" header with the token of a lease on its resource")
	case 1:
	default:
		return 0, problem.New(http.StatusBadRequest, "invalid-token", "send exactly one "+name+" header")
	}
	t, err := fencing.ParseToken(vs[0])
	if err != nil {
		return 0, problem.New(http.StatusBadRequest, "invalid-token", name+": "+err.Error())
	}
	return t, nil
}

// resource is the write's resource: the rule's, or the Fencing-Resource
// header's when no rule matched and the fallback is on (ResourceHeader, or
// ResourceHeaderWithoutRules while rules, the rule set in force, is empty).
func (g *Gate) resource(h http.Header, rule *Rule, vars pathVars, rules int) (string, *problem.Error) {
	if rule != nil {
		return ruleResource(rule, vars)
	}
	if !g.resourceHeader && !(g.resourceHeaderWithoutRules && rules == 0) {
		return "", problem.New(http.StatusBadRequest, "resource-required",
			"no route rule matches this write, so the gate cannot tell which resource it changes")
	}
	vs := h[HeaderResource]
	switch len(vs) {
	case 0:
		return "", problem.New(http.StatusBadRequest, "resource-required",
			"no route rule matches this write: name its resource in a Fencing-Resource header")
	case 1:
	default:
		return "", problem.New(http.StatusBadRequest, "resource-required", "send exactly one Fencing-Resource header")
	}
	if err := fencing.ValidateResource(vs[0]); err != nil {
		return "", problem.New(http.StatusBadRequest, "resource-required", "Fencing-Resource: "+err.Error())
	}
	return vs[0], nil
}

// ruleResource expands a fence rule's template and checks the name.
func ruleResource(rule *Rule, vars pathVars) (string, *problem.Error) {
	res := rule.resource(vars)
	if err := fencing.ValidateResource(res); err != nil {
		return "", problem.New(http.StatusBadRequest, "resource-required",
			fmt.Sprintf("route rule on line %d gives resource %q, which is not a valid resource name: %v", rule.Line, truncate(res), err))
	}
	return res, nil
}
