package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/problem"
)

// hostileRules are the rules of the gate the hostile clients attack.
const hostileRules = `
PUT,PATCH,DELETE,COPY,MOVE /jobs/{id}      fence job:{id}
POST,COPY                  /public/{rest...} pass
*                          /admin/{rest...}  deny
PUT,DELETE,COPY,MOVE       /files/{name}     fence file:{name}
GET                        /ws/{rest...}     upgrade websocket
`

// seen is one request as the upstream received it, before any routing of
// its own: method, raw request target, headers, body.
type seen struct {
	Method, Target string
	Header         http.Header
	Body           string
}

// wireLog is an upstream that logs every request it receives and answers
// 200.
type wireLog struct {
	mu  sync.Mutex
	got []seen
}

func (l *wireLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	l.mu.Lock()
	l.got = append(l.got, seen{Method: r.Method, Target: r.RequestURI, Header: r.Header.Clone(), Body: string(body)})
	l.mu.Unlock()
	_, _ = io.WriteString(w, "applied")
}

func (l *wireLog) requests() []seen {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]seen(nil), l.got...)
}

// admission is one successful Admit.
type admission struct {
	Resource string
	Token    fencing.Token
}

// admitLog is a store that logs every admission it grants.
type admitLog struct {
	fencing.Store
	mu       sync.Mutex
	admitted []admission
}

func (s *admitLog) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	a, err := s.Store.Admit(ctx, req)
	if err == nil {
		s.mu.Lock()
		s.admitted = append(s.admitted, admission{req.Resource, req.Token})
		s.mu.Unlock()
	}
	return a, err
}

func (s *admitLog) has(resource string, token fencing.Token) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.admitted {
		if a.Resource == resource && a.Token == token {
			return true
		}
	}
	return false
}

// hostileEnv is a gate on a real listener in front of a logging upstream,
// with this story in its store: job:1 and file:X were taken over (token 1
// expired, the successor's token 2 wrote), and the stale holder took fresh
// leases on scratch and file:X-scratch (token 1 on each).
type hostileEnv struct {
	gateAddr string
	upstream *url.URL
	store    *admitLog
	up       *wireLog
	rules    []Rule
	header   bool
	// dial opens a client connection to the gate (TCP unless a test sets
	// another transport).
	dial func() (net.Conn, error)
}

// hostileWay is what the gate speaks on either side in a hostile run.
type hostileWay struct {
	server ServerOptions // the listener's (TLS, engines)
	// upstream is how the gate reaches the upstream: HTTP/1.1 over TCP
	// (""), HTTP/2 with prior knowledge ("h2c"), or HTTP/1.1 over a Unix
	// socket ("unix").
	upstream string
}

// serveUpstream serves h as the upstream the way w says, until the test
// ends: its URL, and whether the gate speaks HTTP/2 to it.
func (w hostileWay) serveUpstream(t *testing.T, h http.Handler) (*url.URL, bool) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	t.Cleanup(srv.Close)
	switch w.upstream {
	case "":
	case "h2c":
		srv.Config.Protocols = new(http.Protocols)
		srv.Config.Protocols.SetHTTP1(true)
		srv.Config.Protocols.SetUnencryptedHTTP2(true)
	case "unix":
		dir, err := os.MkdirTemp("", "fg") // short: a socket path has at most 107 bytes
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		ln, err := net.Listen("unix", filepath.Join(dir, "up.sock"))
		if err != nil {
			t.Fatal(err)
		}
		srv.Listener.Close()
		srv.Listener = ln
		srv.Start()
		u, err := url.Parse("unix:" + ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return u, false
	default:
		t.Fatalf("no upstream way %q", w.upstream)
	}
	srv.Start()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u, w.upstream == "h2c"
}

// newHostileEnvOn serves the gate the way w says.
func newHostileEnvOn(t *testing.T, header bool, w hostileWay) *hostileEnv {
	t.Helper()
	clock := newFakeClock()
	ctx := context.Background()
	st := &admitLog{Store: memstore.New(memstore.Options{Clock: clock})}
	acquire := func(res, owner string) fencing.Token {
		l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return l.Token
	}
	acquire("job:1", "stale")
	acquire("file:X", "stale")
	clock.Advance(2 * time.Second)
	for _, res := range []string{"job:1", "file:X"} {
		if tk := acquire(res, "successor"); tk != 2 {
			t.Fatalf("%s: successor token %d", res, tk)
		}
		if _, err := st.Store.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: 2}); err != nil {
			t.Fatal(err)
		}
	}
	acquire("scratch", "stale")
	acquire("file:X-scratch", "stale")

	e := &hostileEnv{store: st, up: &wireLog{}, header: header}
	upstream, h2 := w.serveUpstream(t, e.up)
	e.upstream = upstream
	var err error
	if e.rules, err = ParseRules(hostileRules); err != nil {
		t.Fatal(err)
	}
	g, err := New(Options{Upstream: e.upstream, UpstreamHTTP2: h2, Store: st, Rules: e.rules, ResourceHeader: header})
	if err != nil {
		t.Fatal(err)
	}
	gateSrv := serveGateWith(t, g, w.server)
	e.gateAddr = gateSrv.Listener.Addr().String()
	e.dial = func() (net.Conn, error) { return net.Dial("tcp", e.gateAddr) }
	return e
}

// send writes raw to a fresh connection and reads the responses: want
// many, then any more that arrive within a short while. Each is its
// status, and its problem code if it is a problem ("400 path-not-canonical").
func (e *hostileEnv) send(t *testing.T, raw string, want int) []string {
	t.Helper()
	conn, err := e.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var statuses []string
	for {
		wait := 10 * time.Second
		if len(statuses) >= want {
			wait = 300 * time.Millisecond // anything more is unexpected
		}
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !(errors.As(err, &ne) && ne.Timeout()) {
				t.Logf("reading a response: %v", err)
			}
			return statuses
		}
		var prob struct{ Code string }
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := strconv.Itoa(resp.StatusCode)
		if resp.Header.Get("Content-Type") == problem.ContentType && json.Unmarshal(b, &prob) == nil {
			got += " " + prob.Code
		}
		statuses = append(statuses, got)
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return statuses
		}
	}
}

// upstreamView is how an upstream that decodes, unfolds and resolves as
// much as any real one does (repeated percent-decoding, overlong UTF-8 as
// ASCII, "\" as "/", ";" parameters stripped, "//" merged, dot segments
// and trailing slashes removed, absolute-form reduced to its path) sees a
// raw request target: the path it applies the request to.
func upstreamView(target string) string {
	p := target
	if i := strings.Index(p, "://"); i >= 0 {
		if j := strings.IndexByte(p[i+3:], '/'); j >= 0 {
			p = p[i+3+j:]
		} else {
			p = "/"
		}
	}
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	for range 5 {
		q := strings.NewReplacer("%c0%af", "/", "%C0%AF", "/", "%c0%ae", ".", "%C0%AE", ".", "\xc0\xaf", "/", "\xc0\xae", ".").Replace(p)
		if d, err := url.PathUnescape(q); err == nil {
			q = d
		}
		q = strings.ReplaceAll(q, `\`, "/")
		if q == p {
			break
		}
		p = q
	}
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if j := strings.IndexByte(s, ';'); j >= 0 {
			segs[i] = s[:j]
		}
	}
	return path.Clean("/" + strings.Join(segs, "/"))
}

// upstreamMethod is the method an upstream may apply: the override
// header's or _method parameter's if any, in upper case as lenient
// servers do.
func upstreamMethod(s seen) string {
	if u, err := url.ParseRequestURI(s.Target); err == nil {
		for k, v := range u.Query() {
			if strings.EqualFold(k, "_method") && len(v) > 0 {
				return strings.ToUpper(v[0])
			}
		}
	}
	for k, v := range s.Header {
		n := strings.ToLower(strings.ReplaceAll(k, "_", "-"))
		if (n == "x-http-method-override" || n == "x-http-method" || n == "x-method-override") && len(v) > 0 {
			return strings.ToUpper(v[0])
		}
	}
	return strings.ToUpper(s.Method)
}

// check asserts, from the upstream's log alone, that every request it
// received was one the gate may forward: a read that upgrades only where an
// upgrade rule allows it; a write never under a deny rule, and fenced on
// the resource (and the Destination's resource) the upstream resolves, with
// the token it carries, admitted by the store; a write no rule covers only
// when the header fallback is on and its header resource was admitted.
func (e *hostileEnv) check(t *testing.T) {
	t.Helper()
	for _, s := range e.up.requests() {
		m := upstreamMethod(s)
		view := upstreamView(s.Target)
		for k, v := range s.Header {
			if n := strings.ToLower(strings.ReplaceAll(k, "_", "-")); (n == "x-original-url" || n == "x-rewrite-url") && len(v) > 0 {
				view = upstreamView(v[0]) // the path such an upstream acts on
			}
		}
		segs, _ := splitPath(view)
		if _, up := s.Header["Upgrade"]; up {
			if m != http.MethodGet || !strings.HasPrefix(view, "/ws/") || !strings.EqualFold(s.Header.Get("Upgrade"), "websocket") {
				t.Errorf("upstream got an upgrade no rule allows: %s %q %v", s.Method, s.Target, s.Header)
			}
		}
		if safeMethod(m) {
			continue
		}
		// fenced checks that the token in header was admitted on res.
		fenced := func(what, where, res, header string) {
			if tk, err := fencing.ParseToken(s.Header.Get(header)); err != nil || !e.store.has(res, tk) {
				t.Errorf("upstream got %s %q (%s %s resolves to %s) without an admission of its %s %q on it",
					s.Method, s.Target, what, where, res, header, s.Header.Get(header))
			}
		}
		var source string // the resource the write was judged on
		rule := e.match(m, segs)
		switch {
		case rule == nil && e.header:
			source = s.Header.Get(HeaderResource)
			fenced("resource header", "", source, HeaderToken)
		case rule == nil:
			t.Errorf("upstream got %s %q (resolves to %s), which no rule covers", s.Method, s.Target, view)
		case rule.Action == ActionDeny:
			t.Errorf("upstream got %s %q (resolves to %s), which a deny rule covers", s.Method, s.Target, view)
		case rule.Action == ActionFence:
			source = e.resourceOf(rule, m, segs)
			fenced("path", view, source, HeaderToken)
		}
		if d := s.Header.Get(HeaderDestination); d != "" {
			if u, err := url.Parse(d); err == nil && u.Host != "" {
				d = u.EscapedPath()
			}
			dv := upstreamView(d)
			dsegs, _ := splitPath(dv)
			switch r := e.match(m, dsegs); {
			case r == nil || r.Action == ActionDeny:
				t.Errorf("upstream got %s %q with Destination %q (resolves to %s), which no rule lets through", s.Method, s.Target, d, dv)
			case r.Action == ActionFence:
				// Another resource is judged by its own token
				// (Fencing-Destination-Token), the same one by the
				// write's.
				dest, header := e.resourceOf(r, m, dsegs), HeaderToken
				if dest != source {
					header = HeaderDestinationToken
				}
				fenced("Destination", dv, dest, header)
			}
		}
	}
}

func (e *hostileEnv) match(method string, segs []string) *Rule {
	for i := range e.rules {
		if e.rules[i].Action == ActionUpgrade {
			continue
		}
		if _, ok := e.rules[i].match(method, segs, nil); ok {
			return &e.rules[i]
		}
	}
	return nil
}

func (e *hostileEnv) resourceOf(r *Rule, method string, segs []string) string {
	vars, _ := r.match(method, segs, nil)
	return r.resource(vars)
}

// hostileCase is one request shape of the hostile suite.
type hostileCase struct {
	name      string
	header    bool     // Fencing-Resource fallback on (rules exist: off by default)
	raw       string   // bytes sent on one connection
	want      []string // the responses, in order: status and problem code
	forwarded int      // requests the upstream must receive
}

// hostileCases are the request shapes an attacker (or a careless client)
// would try, with the answers the contract gives them (DESIGN §4) on a
// cleartext HTTP/1.1 connection. Every transport runs them.
func hostileCases() []hostileCase {
	const (
		stale     = "Fencing-Token: 1\r\n" // expired on job:1 and file:X; live on scratch, file:X-scratch
		fresh     = "Fencing-Token: 2\r\n" // the successor's on job:1 and file:X
		staleDest = "Fencing-Destination-Token: 1\r\n"
		asScr     = "Fencing-Resource: scratch\r\n"
		cl0       = "Content-Length: 0\r\n"
	)
	req := func(line string, hdrs ...string) string {
		return line + "\r\nHost: gate\r\n" + strings.Join(hdrs, "") + "\r\n"
	}
	body := func(line, b string, hdrs ...string) string {
		return line + "\r\nHost: gate\r\n" + strings.Join(hdrs, "") + "Content-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b
	}
	smuggled := req("PUT /jobs/1 HTTP/1.1", stale, asScr, cl0)
	return []hostileCase{
		// Encoded traversal past a pass rule, and past fence rules.
		{"encoded slash under pass", false, req("POST /public/..%2Fjobs%2F1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"mixed-case encoded slash", false, req("POST /public/..%2fjobs%2f1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"encoded dots", false, req("POST /public/%2e%2e/jobs/1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"upper-case encoded dots", false, req("POST /public/%2E%2E/jobs/1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"double encoding", false, req("POST /public/..%252Fjobs%252F1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"overlong UTF-8 slash", false, req("POST /public/..%c0%afjobs%c0%af1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"raw overlong UTF-8", false, req("POST /public/..\xc0\xafjobs\xc0\xaf1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"raw backslash", false, req(`POST /public/..\jobs\1 HTTP/1.1`, cl0), []string{"400 path-not-canonical"}, 0},
		{"encoded backslash", false, req("POST /public/..%5Cjobs%5C1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"dot segments", false, req("POST /public/../jobs/1 HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		{"dot segment on a fenced path", false, req("PUT /jobs/2/../1 HTTP/1.1", stale, cl0), []string{"400 path-not-canonical"}, 0},
		{"encoded NUL", false, req("PUT /files/X%00 HTTP/1.1", stale, cl0), []string{"400 path-not-canonical"}, 0},
		{"encoded newline", false, req("POST /public/a%0d%0aPUT HTTP/1.1", cl0), []string{"400 path-not-canonical"}, 0},
		// Non-canonical shapes are refused before the header fallback.
		{"encoded slash past a deny rule, header on", true, req("PUT /admin%2Fusers HTTP/1.1", stale, asScr, cl0), []string{"400 path-not-canonical"}, 0},
		{"path parameter, header on", true, req("PUT /jobs;x/1 HTTP/1.1", stale, asScr, cl0), []string{"400 path-not-canonical"}, 0},
		{"empty segment, header on", true, req("PUT //jobs/1 HTTP/1.1", stale, asScr, cl0), []string{"400 path-not-canonical"}, 0},
		{"dot segment, header on", true, req("PUT /x/../jobs/1 HTTP/1.1", stale, asScr, cl0), []string{"400 path-not-canonical"}, 0},
		{"absolute-form, header on", true, req("PUT http://gate/x/../jobs/1 HTTP/1.1", stale, asScr, cl0), []string{"400 path-not-canonical"}, 0},
		// The server refuses the asterisk-form outside OPTIONS, and PRI,
		// before any decision.
		{"asterisk-form", true, req("PUT * HTTP/1.1", stale, asScr, cl0), []string{"400 path-not-canonical"}, 0},
		// With rules, variants that miss every rule are refused: the
		// header fallback is off.
		{"lower-case method", false, req("put /jobs/1 HTTP/1.1", stale, asScr, cl0), []string{"400 resource-required"}, 0},
		{"trailing slash", false, req("PUT /jobs/1/ HTTP/1.1", stale, asScr, cl0), []string{"400 resource-required"}, 0},
		{"other case", false, req("PUT /Jobs/1 HTTP/1.1", stale, asScr, cl0), []string{"400 resource-required"}, 0},
		// Upgrades and tunnels.
		{"upgrade on an admitted write", false, req("POST /jobs/1 HTTP/1.1", fresh, "Connection: Upgrade\r\nUpgrade: websocket\r\n", cl0), []string{"403 upgrade-denied"}, 0},
		{"upgrade on a fenced PUT", false, req("PUT /jobs/1 HTTP/1.1", fresh, "Connection: Upgrade\r\nUpgrade: websocket\r\n", cl0), []string{"403 upgrade-denied"}, 0},
		{"upgrade on a read without a rule", false, req("GET /jobs/1 HTTP/1.1", "Connection: Upgrade\r\nUpgrade: websocket\r\n"), []string{"403 upgrade-denied"}, 0},
		{"upgrade header alone", false, req("GET /jobs/1 HTTP/1.1", "Upgrade: websocket\r\n"), []string{"403 upgrade-denied"}, 0},
		{"websocket where a rule allows it", false, req("GET /ws/chat HTTP/1.1", "Connection: Upgrade\r\nUpgrade: websocket\r\n"), []string{"200"}, 1},
		{"websocket rule, dot segments", false, req("GET /ws/../jobs/1 HTTP/1.1", "Connection: Upgrade\r\nUpgrade: websocket\r\n"), []string{"400 path-not-canonical"}, 0},
		{"h2c upgrade on a read is ignored", false, req("GET /ws/chat HTTP/1.1", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n"), []string{"200"}, 1},
		{"h2c upgrade on a write", false, req("PUT /jobs/1 HTTP/1.1", fresh, cl0, "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n"), []string{"403 upgrade-denied"}, 0},
		{"h2c prior knowledge", false, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", []string{"403 upgrade-denied"}, 0},
		{"CONNECT", false, req("CONNECT 127.0.0.1:1 HTTP/1.1", fresh, asScr), []string{"403 upgrade-denied"}, 0},
		// WebDAV Destination: a second target, fenced too.
		// The source's token is never judged on the Destination: another
		// resource needs its own token, in Fencing-Destination-Token.
		{"COPY onto another resource with the source's token only", false, req("COPY /files/X-scratch HTTP/1.1", stale, "Destination: /files/X\r\n", cl0), []string{"428 token-required"}, 0},
		{"stale COPY onto a newer file", false, req("COPY /files/X-scratch HTTP/1.1", stale, staleDest, "Destination: /files/X\r\n", cl0), []string{"409 stale-token"}, 0},
		{"stale MOVE onto a newer file", false, req("MOVE /files/X-scratch HTTP/1.1", stale, staleDest, "Destination: /files/X\r\n", cl0), []string{"409 stale-token"}, 0},
		{"stale COPY, absolute Destination", false, req("COPY /files/X-scratch HTTP/1.1", stale, staleDest, "Destination: http://gate/files/X\r\n", cl0), []string{"409 stale-token"}, 0},
		{"COPY under a pass rule onto a fenced job", false, req("COPY /public/a HTTP/1.1", stale, "Destination: /jobs/1\r\n", cl0), []string{"428 token-required"}, 0},
		{"stale COPY under a pass rule onto a fenced job", false, req("COPY /public/a HTTP/1.1", staleDest, "Destination: /jobs/1\r\n", cl0), []string{"409 stale-token"}, 0},
		// Host: one judgement on every engine; a value an upstream could
		// read as a path, query or other host is refused.
		{"Host with a path", false, strings.Replace(req("PUT /jobs/1 HTTP/1.1", fresh, cl0), "Host: gate", "Host: x/../jobs/b", 1), []string{"400 invalid-request"}, 0},
		{"Host with a space", false, strings.Replace(req("PUT /jobs/1 HTTP/1.1", fresh, cl0), "Host: gate", "Host: x y", 1), []string{"400 invalid-request"}, 0},
		{"Host with a backslash", false, strings.Replace(req("PUT /jobs/1 HTTP/1.1", fresh, cl0), "Host: gate", "Host: x\\y", 1), []string{"400 invalid-request"}, 0},
		{"Host with an open bracket", false, strings.Replace(req("PUT /jobs/1 HTTP/1.1", fresh, cl0), "Host: gate", "Host: [::1", 1), []string{"400 invalid-request"}, 0},
		{"Host with a query", false, strings.Replace(req("PUT /jobs/1 HTTP/1.1", fresh, cl0), "Host: gate", "Host: x?y", 1), []string{"400 invalid-request"}, 0},
		{"Host with a fragment", false, strings.Replace(req("PUT /jobs/1 HTTP/1.1", fresh, cl0), "Host: gate", "Host: x#y", 1), []string{"400 invalid-request"}, 0},
		{"Host percent-encoded", false, strings.Replace(req("PUT /jobs/1 HTTP/1.1", fresh, cl0), "Host: gate", "Host: %2e%2e", 1), []string{"400 invalid-request"}, 0},
		{"Host on a read", false, strings.Replace(req("GET /jobs/1 HTTP/1.1"), "Host: gate", "Host: x/y", 1), []string{"400 invalid-request"}, 0},
		{"Host IPv6 with port", false, strings.Replace(req("PUT /jobs/1 HTTP/1.1", fresh, cl0), "Host: gate", "Host: [::1]:8080", 1), []string{"200"}, 1},
		{"COPY, encoded Destination", false, req("COPY /files/X-scratch HTTP/1.1", stale, "Destination: /files/..%2Fjobs%2F1\r\n", cl0), []string{"400 path-not-canonical"}, 0},
		{"COPY onto a denied path", false, req("COPY /files/X-scratch HTTP/1.1", stale, "Destination: /admin/x\r\n", cl0), []string{"403 write-denied"}, 0},
		{"COPY to another host", false, req("COPY /files/X-scratch HTTP/1.1", stale, "Destination: http://elsewhere/files/X\r\n", cl0), []string{"400 path-not-canonical"}, 0},
		{"COPY with two Destinations", false, req("COPY /files/X-scratch HTTP/1.1", stale, "Destination: /files/Y\r\nDestination: /files/X\r\n", cl0), []string{"400 path-not-canonical"}, 0},
		{"fresh MOVE onto its own file", false, req("MOVE /files/X HTTP/1.1", fresh, "Destination: /files/X\r\n", cl0), []string{"200"}, 1},
		// Method overrides.
		{"GET overridden to DELETE", false, req("GET /jobs/1 HTTP/1.1", "X-HTTP-Method-Override: DELETE\r\n"), []string{"403 method-override-denied"}, 0},
		{"POST under pass overridden to DELETE", false, req("POST /public/x HTTP/1.1", "X-HTTP-Method: DELETE\r\n", cl0), []string{"403 method-override-denied"}, 0},
		{"override spelt with underscores", false, req("GET /jobs/1 HTTP/1.1", "X_HTTP_Method_Override: PUT\r\n"), []string{"403 method-override-denied"}, 0},
		// A fencing header spelt with underscores: CGI-style servers read
		// it as the one the gate judged.
		{"token spelt with underscores beside the token", false, req("PUT /jobs/1 HTTP/1.1", fresh, "Fencing_Token: 1\r\n", cl0), []string{"400 invalid-request"}, 0},
		{"resource spelt with underscores", false, req("PUT /jobs/1 HTTP/1.1", fresh, "fencing_resource: scratch\r\n", cl0), []string{"400 invalid-request"}, 0},
		{"_method query parameter", false, req("POST /public/x?a=1&_method=DELETE HTTP/1.1", cl0), []string{"403 method-override-denied"}, 0},
		{"encoded _method query parameter", false, req("POST /public/x?%5Fmethod=PUT HTTP/1.1", cl0), []string{"403 method-override-denied"}, 0},
		{"_method as PHP reads .method", false, req("POST /public/x?.method=DELETE HTTP/1.1", cl0), []string{"403 method-override-denied"}, 0},
		{"_method as PHP reads [method", false, req("POST /public/x?%5Bmethod=DELETE HTTP/1.1", cl0), []string{"403 method-override-denied"}, 0},
		{"X-Original-URL", false, req("POST /public/x HTTP/1.1", "X-Original-URL: /jobs/1\r\n", cl0), []string{"400 path-not-canonical"}, 0},
		{"X-Rewrite-URL on a read", false, req("GET /public/x HTTP/1.1", "X-Rewrite-URL: /jobs/1\r\n"), []string{"400 path-not-canonical"}, 0},
		{"X-Method-Override", false, req("GET /jobs/1 HTTP/1.1", "X-Method-Override: PUT\r\n"), []string{"403 method-override-denied"}, 0},
		// Smuggling: the upstream sees only the requests the gate judged,
		// re-framed by the gate. With both framings, chunked wins,
		// Content-Length is dropped, and the connection is closed after
		// the answer (RFC 9112 §6.1): what follows is never read.
		{"TE and CL", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nContent-Length: " + strconv.Itoa(5+len(smuggled)) + "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, []string{"200", "409 stale-token"}, 1},
		{"TE identity beside CL", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc", []string{"501 invalid-request"}, 0},
		{"duplicate CL", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nContent-Length: 0\r\nContent-Length: " + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled, []string{"400 invalid-request"}, 0},
		// An obs-fold is unfolded into one space (RFC 9112 §5.2) before the
		// gate judges the header, and forwarded unfolded.
		{"obs-fold", false, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: 1\r\n 2\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-token"}, 0},
		{"obs-fold in another header", false, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: 2\r\nX-Note: a\r\n b\r\nContent-Length: 0\r\n\r\n", []string{"200"}, 1},
		// A head with bare LF line ends is read as RFC 9112 §2.2 allows and
		// judged like any other.
		{"bare LF line ends", false, "PUT /jobs/1 HTTP/1.1\nHost: gate\nFencing-Token: 2\nContent-Length: 0\n\n", []string{"200"}, 1},
		{"space before a colon", false, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token : 1\r\nFencing-Token: 2\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"NUL in a header", false, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: 2\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"two Host headers", false, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nHost: other\r\nFencing-Token: 2\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"two Transfer-Encodings", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, []string{"501 invalid-request"}, 0},
		{"a coding before chunked", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + smuggled, []string{"501 invalid-request"}, 0},
		{"signed Content-Length", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nContent-Length: +" + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled, []string{"400 invalid-request"}, 0},
		{"head past 8 KiB", false, req("PUT /jobs/1 HTTP/1.1", fresh, cl0, "X-Pad: "+strings.Repeat("a", 9<<10)+"\r\n"), []string{"431 invalid-request"}, 0},
		// Request lines and headers a lenient parser might read two ways:
		// refused, or read one way and re-framed (the next request is
		// judged on its own). Transfer-Encoding: identity (RFC 9112 no
		// longer defines it) is refused like any coding but chunked.
		{"two spaces after method", false, "PUT  /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"two spaces before version", false, "PUT /jobs/1  HTTP/1.1\r\nHost: gate\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"tab separator", false, "PUT\t/jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"extra token in line", false, "PUT /jobs/1 HTTP/1.1 x\r\nHost: gate\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"no version", false, "PUT /jobs/1\r\nHost: gate\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"HTTP/2.0 line", false, "PUT /jobs/1 HTTP/2.0\r\nHost: gate\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n", []string{"505 invalid-request"}, 0},
		{"HTTP/1.10", false, "PUT /jobs/1 HTTP/1.10\r\nHost: gate\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"header without colon", false, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token 1\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"CL list", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nContent-Length: 0, " + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled, []string{"400 invalid-request"}, 0},
		{"CL spaces", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nContent-Length:  0 \r\n\r\n" + smuggled, []string{"200", "409 stale-token"}, 1},
		{"TE chunked uppercase", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n" + smuggled, []string{"200", "409 stale-token"}, 1},
		{"TE with space before colon", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, []string{"400 invalid-request"}, 0},
		{"TE identity with CL", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, []string{"501 invalid-request"}, 0},
		// HTTP/1.0 has no chunked framing: the body is empty, the connection
		// closed after the answer, and what follows never read.
		{"HTTP/1.0 TE chunked", false, "POST /public/a HTTP/1.0\r\nHost: gate\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, []string{"200"}, 1},
		{"chunk size with leading spaces", false, "POST /public/a HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\n\r\n 0\r\n\r\n" + smuggled, []string{"400 invalid-body"}, 0},
		{"NUL in path", false, "PUT /jobs/1\x00 HTTP/1.1\r\nHost: gate\r\nFencing-Token: 2\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"fragment", false, "PUT /jobs/1#x HTTP/1.1\r\nHost: gate\r\nFencing-Token: 2\r\nContent-Length: 0\r\n\r\n", []string{"400 path-not-canonical"}, 0},
		{"a second host header in lower case", false, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nhost: other\r\nFencing-Token: 2\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"bare CR in a header", false, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: 2\rX: y\r\nContent-Length: 0\r\n\r\n", []string{"400 invalid-request"}, 0},
		{"pipelined after a refused write", false, body("POST /public/..%2Fjobs%2F1 HTTP/1.1", smuggled) + req("PUT /jobs/1 HTTP/1.1", stale, cl0), []string{"400 path-not-canonical", "409 stale-token"}, 0},
		{"pipelined after a stale write", false, body("PUT /jobs/1 HTTP/1.1", smuggled, stale) + req("PUT /jobs/1 HTTP/1.1", fresh, cl0), []string{"409 stale-token", "200"}, 1},
	}
}

// TestHostileClients sends the hostile shapes as raw bytes on a real
// cleartext connection, and checks the upstream's own log: nothing reaches
// it that the gate did not admit on the resource the upstream acts on (see
// check), and each shape gets the answer the contract gives it. It runs
// them on the event loops (batching through io_uring where the kernel has
// it, and not), on the general engine alone (as off Linux), and on the
// general engine in front of an HTTP/2 (h2c) and a Unix-socket upstream;
// TLS in hostile_tls_test.go.
func TestHostileClients(t *testing.T) {
	head := time.Second
	ways := []struct {
		name string
		hostileWay
	}{
		{"", hostileWay{server: ServerOptions{HeaderTimeout: head}}},
		{" (plain I/O)", hostileWay{server: ServerOptions{HeaderTimeout: head, NoIOURing: true}}},
		{" (general engine)", hostileWay{server: ServerOptions{HeaderTimeout: head, NoEventLoops: true}}},
		{" (h2c upstream)", hostileWay{server: ServerOptions{HeaderTimeout: head}, upstream: "h2c"}},
		{" (unix upstream)", hostileWay{server: ServerOptions{HeaderTimeout: head}, upstream: "unix"}},
	}
	for _, c := range hostileCases() {
		for _, w := range ways {
			want, forwarded := c.want, c.forwarded
			if w.upstream == "h2c" && c.name == "websocket where a rule allows it" {
				// HTTP/2 has no Upgrade (and the gate no extended
				// CONNECT): a WebSocket cannot reach an HTTP/2 upstream.
				want, forwarded = []string{"502 upstream-unavailable"}, 0
			}
			t.Run(c.name+w.name, func(t *testing.T) {
				t.Parallel()
				e := newHostileEnvOn(t, c.header, w.hostileWay)
				e.judge(t, c.raw, want, forwarded)
			})
		}
	}
}

// judge sends raw on a fresh connection and checks the answers (want), the
// number of requests the upstream received (forwarded), and, from the
// upstream's record, that each was one the gate may forward, with the
// target the client sent byte for byte.
func (e *hostileEnv) judge(t *testing.T, raw string, want []string, forwarded int) {
	t.Helper()
	got := e.send(t, raw, len(want))
	if !slices.Equal(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	e.judgeUpstream(t, forwarded, func(method, target string) bool {
		return strings.HasPrefix(raw, method+" "+target+" ") || strings.Contains(raw, "\n"+method+" "+target+" ")
	})
}

// judgeUpstream checks the upstream's record: forwarded requests, each one
// the gate may forward (check), every write's target one the client sent
// (sent reports whether it did).
func (e *hostileEnv) judgeUpstream(t *testing.T, forwarded int, sent func(method, target string) bool) {
	t.Helper()
	if n := len(e.up.requests()); n != forwarded {
		t.Errorf("upstream got %d requests, want %d: %+v", n, forwarded, e.up.requests())
	}
	e.check(t)
	for _, s := range e.up.requests() {
		if !safeMethod(s.Method) && !sent(s.Method, s.Target) {
			t.Errorf("upstream got target %q, which the client did not send byte for byte", s.Target)
		}
	}
}
