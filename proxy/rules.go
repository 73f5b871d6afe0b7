package proxy

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/fencegate/fencegate/fencing"
)

// Action is what a route rule does with a write that matches it.
type Action int

// The actions a rule may take.
const (
	// ActionFence fences the write: it needs a Fencing-Token that the store
	// admits for the resource the rule's template names.
	ActionFence Action = iota + 1
	// ActionPass forwards the write unfenced (no token needed).
	ActionPass
	// ActionDeny refuses the write with 403 write-denied.
	ActionDeny
	// ActionUpgrade (safe methods only) lets a protocol upgrade named in
	// the rule's Protocols through, unfenced: the way to allow WebSockets.
	ActionUpgrade
)

// String returns the action's keyword in the rule syntax.
func (a Action) String() string {
	switch a {
	case ActionFence:
		return "fence"
	case ActionPass:
		return "pass"
	case ActionDeny:
		return "deny"
	case ActionUpgrade:
		return "upgrade"
	}
	return "unknown"
}

// Rule maps unsafe requests (a method set and a path pattern) to an action
// and, for fence rules, to a resource template. Build rules with ParseRules;
// a Rule literal is not usable. Fence, pass and deny rules are consulted
// only for unsafe methods: safe methods (GET, HEAD, OPTIONS, TRACE) pass
// unfenced, and upgrade rules, which name safe methods only, are consulted
// only for safe requests that ask for a protocol upgrade.
type Rule struct {
	// Line is the 1-based line of the rule in the text given to ParseRules.
	Line int
	// Methods lists the methods the rule applies to; nil means any unsafe
	// method (written "*").
	Methods []string
	// Pattern is the path pattern as written, e.g. "/jobs/{id}".
	Pattern string
	// Action is what the rule does.
	Action Action
	// Strict (fence rules only) also requires the token to be the live
	// lease's token: a write after the lease expired or was released is
	// refused with 409 lease-not-held even if no newer token was issued.
	Strict bool
	// Template (fence rules only) is the resource template as written,
	// e.g. "job:{id}".
	Template string
	// Protocols (upgrade rules only) lists the upgrade protocols the rule
	// allows, lower case, e.g. ["websocket"].
	Protocols []string

	segs []segment
	tmpl []tmplPart
}

type segment struct {
	lit  string // literal segment, when name is empty
	name string // variable name
	rest bool   // {name...}: matches the rest of the path, possibly empty
}

type tmplPart struct {
	lit  string
	name string // when non-empty, the value of this pattern variable
}

// pathVars are the values of a rule's pattern variables, in the
// pattern's order.
type pathVars []pathVar

type pathVar struct{ name, value string }

// get is the value of the variable name, or "".
func (v pathVars) get(name string) string {
	for _, p := range v {
		if p.name == name {
			return p.value
		}
	}
	return ""
}

// match reports whether the rule applies to method and the escaped path,
// and returns the pattern variables' percent-decoded values appended to
// vars (a caller's buffer, so that matching allocates nothing; nil is
// fine).
func (r *Rule) match(method string, segs []string, vars pathVars) (pathVars, bool) {
	if r.Methods != nil && !slices.Contains(r.Methods, method) {
		return nil, false
	}
	for i, s := range r.segs {
		if i >= len(segs) {
			return nil, false
		}
		if s.rest {
			return append(vars, pathVar{s.name, strings.Join(segs[i:], "/")}), true
		}
		if s.name == "" {
			if segs[i] != s.lit {
				return nil, false
			}
			continue
		}
		if segs[i] == "" {
			return nil, false
		}
		vars = append(vars, pathVar{s.name, segs[i]})
	}
	if len(segs) != len(r.segs) {
		return nil, false
	}
	return vars, true
}

// resource expands the rule's template with the pattern variables.
func (r *Rule) resource(vars pathVars) string {
	if len(r.tmpl) == 1 && r.tmpl[0].name == "" {
		return r.tmpl[0].lit
	}
	n := 0
	for _, p := range r.tmpl {
		n += len(p.lit) + len(vars.get(p.name))
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range r.tmpl {
		if p.name != "" {
			b.WriteString(vars.get(p.name))
		} else {
			b.WriteString(p.lit)
		}
	}
	return b.String()
}

// errDotSegment: a path with "." or ".." segments (also percent-encoded).
// The gate refuses fenced writes to such paths rather than guess how the
// upstream resolves them.
var errDotSegment = errors.New(`path has "." or ".." segments`)

// splitPath splits an escaped path into its percent-decoded segments,
// without the leading slash. A segment that decodes to "/" characters
// keeps them, so "/jobs/a%2Fb" is two segments, "jobs" and "a/b".
func splitPath(escaped string) ([]string, error) {
	return appendSegments(nil, escaped)
}

// appendSegments is splitPath appending to segs (a caller's buffer, so
// that splitting allocates nothing for a path without escapes).
func appendSegments(segs []string, escaped string) ([]string, error) {
	for s := range strings.SplitSeq(strings.TrimPrefix(escaped, "/"), "/") {
		if strings.IndexByte(s, '%') >= 0 {
			d, err := url.PathUnescape(s)
			if err != nil {
				return nil, err
			}
			s = d
		}
		if s == "." || s == ".." {
			return nil, errDotSegment
		}
		segs = append(segs, s)
	}
	return segs, nil
}

// safeMethod reports whether m is one of the methods the gate never fences.
func safeMethod(m string) bool {
	switch m {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	return false
}

// ParseRules parses route rules, one per line; ";" also separates rules,
// so a list fits in one environment variable. Blank lines and text from
// "#" to the end of a line are ignored. Each rule is
//
//	METHODS PATTERN ACTION
//
// where METHODS is "*" (any unsafe method) or a comma-separated list of
// unsafe methods (case-sensitive, e.g. "PUT,PATCH,DELETE"); PATTERN is an
// absolute path whose segments are literals, "{name}" (one non-empty
// segment) or, last only, "{name...}" (the rest of the path, possibly
// empty: "/admin/{rest...}" matches "/admin/" and below, not "/admin").
// Paths are matched segment by segment after percent-decoding each
// segment; a trailing slash is significant ("/jobs/{id}" does not match
// "/jobs/7/"). Unsafe requests whose path is not canonical (see
// CheckPath) are refused before any rule is consulted. ACTION is one of
//
//	fence TEMPLATE         fence the write on the resource TEMPLATE names
//	fence strict TEMPLATE  same, and the token must hold the live lease
//	pass                   forward without fencing
//	deny                   refuse with 403 write-denied
//	upgrade PROTOCOLS      let a protocol upgrade through (safe methods only)
//
// TEMPLATE is resource-name text ([A-Za-z0-9._:~-]) with "{name}"
// references to the pattern's variables, e.g. "job:{id}". PROTOCOLS is a
// comma-separated list of upgrade protocol names (case-insensitive, e.g.
// "websocket"); h2c is never allowed, since an HTTP/2 connection would
// carry later writes past the gate. Upgrade rules name safe methods
// explicitly; every other rule names unsafe methods or "*". Example:
//
//	PUT,PATCH,DELETE /jobs/{id}        fence job:{id}
//	POST             /jobs/{id}/finish fence strict job:{id}
//	COPY,MOVE        /files/{name}     fence file:{name}
//	POST             /healthcheck      pass
//	*                /admin/{rest...}  deny
//	GET              /ws/{rest...}     upgrade websocket
//
// A write that names a second target in a Destination header (WebDAV COPY
// and MOVE) has that path judged by the same rules with the same method,
// and is fenced on both resources (see Gate).
//
// The first rule that matches a request wins. Errors name the line.
func ParseRules(text string) ([]Rule, error) {
	var rules []Rule
	for i, line := range strings.Split(text, "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		for _, part := range strings.Split(line, ";") {
			if strings.TrimSpace(part) == "" {
				continue
			}
			r, err := parseRule(strings.Fields(part))
			if err != nil {
				return nil, fmt.Errorf("rules: line %d: %q: %w", i+1, strings.TrimSpace(part), err)
			}
			r.Line = i + 1
			rules = append(rules, r)
		}
	}
	return rules, nil
}

func parseRule(f []string) (Rule, error) {
	if len(f) < 3 {
		return Rule{}, errors.New(`want "METHODS PATTERN ACTION", e.g. "PUT /jobs/{id} fence job:{id}"`)
	}
	var r Rule
	upgrade := f[2] == "upgrade"
	if f[0] == "*" && upgrade {
		return Rule{}, errors.New(`an upgrade rule names its safe methods, e.g. "GET /ws/{rest...} upgrade websocket"`)
	}
	if f[0] != "*" {
		seen := map[string]bool{}
		for _, m := range strings.Split(f[0], ",") {
			if err := checkMethod(m, upgrade); err != nil {
				return Rule{}, err
			}
			if !seen[m] {
				seen[m] = true
				r.Methods = append(r.Methods, m)
			}
		}
	}
	r.Pattern = f[1]
	vars, err := r.parsePattern()
	if err != nil {
		return Rule{}, err
	}
	switch f[2] {
	case "pass", "deny":
		if len(f) != 3 {
			return Rule{}, fmt.Errorf("%s takes no arguments, got %q", f[2], strings.Join(f[3:], " "))
		}
		r.Action = ActionPass
		if f[2] == "deny" {
			r.Action = ActionDeny
		}
		return r, nil
	case "upgrade":
		r.Action = ActionUpgrade
		if len(f) != 4 {
			return Rule{}, errors.New(`upgrade takes one comma-separated list of protocols, e.g. "upgrade websocket"`)
		}
		for _, p := range strings.Split(f[3], ",") {
			p = strings.ToLower(p)
			if !validProtocol(p) {
				return Rule{}, fmt.Errorf("upgrade protocol %q: not a protocol name", p)
			}
			if p == "h2c" {
				return Rule{}, errors.New("upgrade protocol h2c: an HTTP/2 connection would carry later writes past the gate unfenced")
			}
			r.Protocols = append(r.Protocols, p)
		}
		return r, nil
	case "fence":
		r.Action = ActionFence
		args := f[3:]
		if len(args) > 0 && args[0] == "strict" {
			r.Strict = true
			args = args[1:]
		}
		if len(args) != 1 {
			return Rule{}, errors.New(`fence takes one resource template, e.g. "fence job:{id}" or "fence strict job:{id}"`)
		}
		r.Template = args[0]
		if err := r.parseTemplate(vars); err != nil {
			return Rule{}, err
		}
		return r, nil
	}
	return Rule{}, fmt.Errorf("unknown action %q: want fence, fence strict, pass, deny or upgrade", f[2])
}

func checkMethod(m string, upgrade bool) error {
	if m == "" {
		return errors.New("empty method in the method list")
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if 'a' <= c && c <= 'z' {
			return fmt.Errorf("method %q: methods are case-sensitive, write %q", m, strings.ToUpper(m))
		}
		if !('A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Errorf("method %q: not an HTTP method token", m)
		}
	}
	if m == "*" {
		return errors.New(`"*" must stand alone, not in a method list`)
	}
	if upgrade && !safeMethod(m) {
		return fmt.Errorf("method %s: upgrades are refused on unsafe methods, an upgrade rule for them would never apply", m)
	}
	if !upgrade && safeMethod(m) {
		return fmt.Errorf("method %s: safe methods are never fenced, a rule for them would never apply", m)
	}
	return nil
}

// validProtocol reports whether p is an upgrade protocol name: an HTTP
// token, optionally with a "/version".
func validProtocol(p string) bool {
	if p == "" {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~/", c) >= 0) {
			return false
		}
	}
	return true
}

// parsePattern fills r.segs and returns the pattern's variable names.
func (r *Rule) parsePattern() (map[string]bool, error) {
	p := r.Pattern
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("pattern %q must start with /", p)
	}
	vars := map[string]bool{}
	parts := strings.Split(p[1:], "/")
	for i, s := range parts {
		if !strings.ContainsAny(s, "{}") {
			if s == "." || s == ".." {
				return nil, fmt.Errorf("pattern %q: %q segments never match", p, s)
			}
			if strings.IndexByte(s, '%') >= 0 {
				d, err := url.PathUnescape(s)
				if err != nil {
					return nil, fmt.Errorf("pattern %q: bad escape in %q", p, s)
				}
				s = d
			}
			r.segs = append(r.segs, segment{lit: s})
			continue
		}
		if len(s) < 3 || s[0] != '{' || s[len(s)-1] != '}' {
			return nil, fmt.Errorf("pattern %q: segment %q: a variable must be a whole segment, {name} or {name...}", p, s)
		}
		name := s[1 : len(s)-1]
		seg := segment{}
		if strings.HasSuffix(name, "...") {
			if i != len(parts)-1 {
				return nil, fmt.Errorf("pattern %q: {%s} may only be the last segment", p, name)
			}
			name = strings.TrimSuffix(name, "...")
			seg.rest = true
		}
		if !validName(name) {
			return nil, fmt.Errorf("pattern %q: variable name %q: use letters, digits and _", p, name)
		}
		if vars[name] {
			return nil, fmt.Errorf("pattern %q: variable {%s} appears twice", p, name)
		}
		vars[name] = true
		seg.name = name
		r.segs = append(r.segs, seg)
	}
	return vars, nil
}

// parseTemplate fills r.tmpl, checking that the literal text is made of
// resource-name bytes and every reference names a pattern variable.
func (r *Rule) parseTemplate(vars map[string]bool) error {
	t := r.Template
	for t != "" {
		open := strings.IndexByte(t, '{')
		lit := t
		if open >= 0 {
			lit = t[:open]
		}
		if strings.IndexByte(lit, '}') >= 0 {
			return fmt.Errorf("template %q: unmatched }", r.Template)
		}
		for i := 0; i < len(lit); i++ {
			if !fencing.IsResourceByte(lit[i]) {
				return fmt.Errorf("template %q: %q is not allowed in a resource name (use A-Z a-z 0-9 . _ : ~ -)", r.Template, lit[i])
			}
		}
		if lit != "" {
			r.tmpl = append(r.tmpl, tmplPart{lit: lit})
		}
		if open < 0 {
			break
		}
		end := strings.IndexByte(t[open:], '}')
		if end < 0 {
			return fmt.Errorf("template %q: unclosed {", r.Template)
		}
		name := t[open+1 : open+end]
		if !vars[name] {
			return fmt.Errorf("template %q: {%s} is not a variable of pattern %q", r.Template, name, r.Pattern)
		}
		r.tmpl = append(r.tmpl, tmplPart{name: name})
		t = t[open+end+1:]
	}
	if len(r.tmpl) == 0 {
		return errors.New("fence needs a non-empty resource template")
	}
	// The shortest name the template can give: its literal bytes and one
	// byte per segment variable (a segment is never empty; {rest...} may be).
	shortest := 0
	for _, p := range r.tmpl {
		shortest += len(p.lit)
		for _, s := range r.segs {
			if p.name != "" && s.name == p.name && !s.rest {
				shortest++
			}
		}
	}
	if shortest > fencing.MaxNameBytes {
		return fmt.Errorf("template %q gives names of at least %d bytes, longer than a resource name may be (%d): every write it fences would be refused", r.Template, shortest, fencing.MaxNameBytes)
	}
	return nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
