package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestDecideTargets: how a write's own path and its Destination combine
// into the resources it is fenced on.
func TestDecideTargets(t *testing.T) {
	rules, err := ParseRules(`
		COPY,MOVE /b/{name}        fence b:{name}
		COPY,MOVE /a/{name}        fence strict a:{name}
		COPY,MOVE /same/{name}     fence same
		COPY,MOVE /open/{rest...}  pass
	`)
	if err != nil {
		t.Fatal(err)
	}
	up, _ := url.Parse("http://upstream:1")
	for _, header := range []bool{false, true} {
		g, err := New(Options{Upstream: up, Store: memstore.New(memstore.Options{}), Rules: rules, ResourceHeader: header})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			target, dest string
			verdict      Verdict
			want         []Target
		}{
			{"/b/1", "/a/2", Fence, []Target{{"a:2", 7, true}, {"b:1", 3, false}}}, // resource order, each its own token
			{"/a/1", "/b/2", Fence, []Target{{"a:1", 3, true}, {"b:2", 7, false}}},
			{"/same/1", "/same/2", Fence, []Target{{"same", 3, false}}}, // one resource, one token, one admission
			{"/open/x", "/b/2", Fence, []Target{{"b:2", 7, false}}},     // pass source, fenced destination
			{"/b/1", "/open/x", Fence, []Target{{"b:1", 3, false}}},
			{"/open/x", "/open/y", Forward, nil},
			{"/b/1", "/nowhere", Refuse, nil}, // the header never names a Destination's resource
			{"/b/1", "http://gate/a/2", Fence, []Target{{"a:2", 7, true}, {"b:1", 3, false}}},
			{"/b/1", "http://upstream:1/a/2", Fence, []Target{{"a:2", 7, true}, {"b:1", 3, false}}},
			{"/b/1", "http://other/a/2", Refuse, nil},
			{"/b/1", "/a/2?x", Refuse, nil},
		} {
			h := http.Header{HeaderToken: {"3"}, HeaderDestinationToken: {"7"}, HeaderResource: {"hdr"}, HeaderDestination: {c.dest}}
			d := g.decide(Incoming{Method: "COPY", Target: c.target, Host: "gate", Header: h})
			if d.Verdict != c.verdict || len(d.Targets) != len(c.want) {
				t.Errorf("header=%v COPY %s -> %s: %+v, want verdict %d targets %v", header, c.target, c.dest, d, c.verdict, c.want)
				continue
			}
			for i := range c.want {
				if d.Targets[i] != c.want[i] {
					t.Errorf("header=%v COPY %s -> %s: targets %v, want %v", header, c.target, c.dest, d.Targets, c.want)
				}
			}
			if want := fencing.Token(3); d.Verdict == Fence && strings.HasPrefix(c.target, "/open/") {
				want = 7 // only the destination is fenced
				if d.Token != want {
					t.Errorf("token %d, want %d", d.Token, want)
				}
			} else if d.Verdict == Fence && d.Token != want {
				t.Errorf("token %d, want %d", d.Token, want)
			}
		}
	}
}

// TestDestinationOrderedAtBarrier: a COPY whose Destination is X is
// registered at X's barrier too, so it does not overtake a lower-token
// write to X still in flight; and a COPY refused on its Destination never
// reaches the upstream, though its source admitted it.
// TestTwoTargetsShareOneBarrierTimeout: a COPY waits behind a lower token
// on its source, then behind one on its Destination, each wait shorter
// than BarrierTimeout but the two longer: it is refused with
// barrier-timeout and never forwarded. The first resource's place (with
// the shared barrier, an entry whose lifetime counts one BarrierTimeout)
// must outlast the wait on the second; each target used to have a
// BarrierTimeout of its own, and the write reached the upstream after its
// first entry could have expired.
func TestTwoTargetsShareOneBarrierTimeout(t *testing.T) {
	const bt = 500 * time.Millisecond
	e := newEnv(t, "PUT,COPY /files/{name} fence file:{name}", func(o *Options) { o.ResourceHeader, o.BarrierTimeout = false, bt })
	release := map[string]chan struct{}{"S": make(chan struct{}), "X": make(chan struct{})}
	arrived := make(chan string, 2)
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		if rec.Method == "PUT" {
			name := strings.TrimPrefix(rec.Path, "/files/")
			arrived <- name
			<-release[name]
		}
		return false
	}
	for _, res := range []string{"file:S", "file:X"} {
		e.acquire(res, "old", time.Second)
	}
	e.clock.Advance(2 * time.Second)
	for _, res := range []string{"file:S", "file:X"} {
		e.acquire(res, "new", 10*time.Second)
	}
	puts := make(chan response, 2)
	for _, name := range []string{"S", "X"} { // the old holder's writes, in flight
		go func() {
			r, _ := doReq(e.client, e.gateSrv.URL, "PUT", "/files/"+name, "old", HeaderToken, "1")
			puts <- r
		}()
	}
	<-arrived
	<-arrived
	cp := make(chan response, 1)
	go func() {
		r, _ := doReq(e.client, e.gateSrv.URL, "COPY", "/files/S", "", HeaderToken, "2", HeaderDestination, "/files/X", HeaderDestinationToken, "2")
		cp <- r
	}()
	waitFor(t, "the COPY registered on its source", func() bool { return e.gate.registered("file:S", 2) == 1 })
	time.Sleep(bt * 6 / 10)
	close(release["S"]) // its wait on file:S ends, under the timeout
	time.Sleep(bt * 6 / 10)
	close(release["X"]) // so does the wait on file:X, but not the two
	r := <-cp
	wantProblem(t, r, http.StatusServiceUnavailable, "barrier-timeout")
	for range 2 {
		if r := <-puts; r.Status != http.StatusOK {
			t.Fatalf("old PUT: %d %s", r.Status, r.Body)
		}
	}
	for _, rec := range e.up.requests() {
		if rec.Method == "COPY" {
			t.Fatalf("the COPY reached the upstream after waiting longer than BarrierTimeout in all: %+v", rec)
		}
	}
}

func TestDestinationOrderedAtBarrier(t *testing.T) {
	e := newEnv(t, "PUT,COPY /files/{name} fence file:{name}", func(o *Options) { o.ResourceHeader = false })
	var mu sync.Mutex
	var events []string
	note := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
	arrived, release := make(chan struct{}), make(chan struct{})
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		note("arrive " + rec.Method)
		if rec.Method == "PUT" {
			close(arrived)
			<-release
		}
		note("done " + rec.Method)
		return false
	}
	for _, res := range []string{"file:X", "file:S"} {
		e.acquire(res, "old", time.Second)
	}
	e.clock.Advance(2 * time.Second)
	for _, res := range []string{"file:X", "file:S"} {
		if l := e.acquire(res, "new", 10*time.Second); l.Token != 2 {
			t.Fatalf("%s: token %d", res, l.Token)
		}
	}
	put := make(chan response, 1)
	go func() {
		r, _ := doReq(e.client, e.gateSrv.URL, "PUT", "/files/X", "one", HeaderToken, "1")
		put <- r
	}()
	<-arrived
	cp := make(chan response, 1)
	go func() {
		r, _ := doReq(e.client, e.gateSrv.URL, "COPY", "/files/S", "", HeaderToken, "2", HeaderDestination, "/files/X", HeaderDestinationToken, "2")
		cp <- r
	}()
	waitFor(t, "the COPY registered on both files", func() bool {
		return e.gate.registered("file:X", 2) == 1 && e.gate.registered("file:S", 2) == 1
	})
	close(release)
	if r := <-put; r.Status != 200 {
		t.Fatalf("PUT: %d %s", r.Status, r.Body)
	}
	if r := <-cp; r.Status != 200 {
		t.Fatalf("COPY: %d %s", r.Status, r.Body)
	}
	mu.Lock()
	got := strings.Join(events, ",")
	mu.Unlock()
	if got != "arrive PUT,done PUT,arrive COPY,done COPY" {
		t.Fatalf("upstream events %s", got)
	}

	// A stale holder's fresh lease on file:T (token 1) admits token 1
	// there, first in resource order; file:X, whose mark is 2, refuses
	// it: the COPY is refused and never forwarded. file:T's mark stays
	// raised to 1, the holder's own token there.
	e.acquire("file:T", "stale", 10*time.Second)
	r := e.do("COPY", "/files/T", "", HeaderToken, "1", HeaderDestination, "/files/X")
	wantProblem(t, r, 428, "token-required") // file:X's own token is missing
	if !strings.Contains(r.Problem["detail"].(string), HeaderDestinationToken) {
		t.Fatalf("detail %q does not name %s", r.Problem["detail"], HeaderDestinationToken)
	}
	r = e.do("COPY", "/files/T", "", HeaderToken, "1", HeaderDestination, "/files/X", HeaderDestinationToken, "1")
	wantProblem(t, r, 409, "stale-token")
	if r.Problem["resource"] != "file:X" {
		t.Fatalf("refusal names %v", r.Problem["resource"])
	}
	if n := e.up.count(); n != 2 {
		t.Fatalf("upstream got %d requests", n)
	}
	st, err := e.store.Status(context.Background(), "file:T")
	if err != nil || st.HighWater != 1 {
		t.Fatalf("file:T: %+v %v", st, err)
	}
}

// TestDecisionUsesOneRuleSet: a reload that lands while a COPY is being
// judged does not judge its path by one rule set and its Destination by
// the other. Here the old set passes the path and fences the Destination,
// the new one the reverse: each alone refuses the COPY without tokens, and
// so must any decision made across the reload.
func TestDecisionUsesOneRuleSet(t *testing.T) {
	oldRules, err := ParseRules("COPY /src/{x} pass\nCOPY /dst/{x} fence d:{x}")
	if err != nil {
		t.Fatal(err)
	}
	newRules, err := ParseRules("COPY /src/{x} fence s:{x}\nCOPY /dst/{x} pass")
	if err != nil {
		t.Fatal(err)
	}
	up, _ := url.Parse("http://upstream:1")
	g, err := New(Options{Upstream: up, Store: memstore.New(memstore.Options{}), Rules: oldRules})
	if err != nil {
		t.Fatal(err)
	}
	g.afterRulesLoad = func() { _ = g.SetRules(newRules) } // the reload, right after the decision loaded the rules
	d := g.decide(Incoming{Method: "COPY", Target: "/src/1", Host: "gate", Header: http.Header{HeaderDestination: {"/dst/1"}}})
	if d.Verdict != Refuse || d.Problem == nil || d.Problem.Code != "token-required" {
		t.Fatalf("a COPY judged across a reload: %+v, want 428 token-required as under either rule set", d)
	}
}

// TestDestinationUnderTheUpstreamBase: with a base path in the upstream's
// URL, the Destination the upstream gets is the judged path under that
// base, as the request's own path is, so the upstream changes the resource
// the gate fenced; without a base it goes as the client sent it. Read from
// the upstream's record, on each engine.
func TestDestinationUnderTheUpstreamBase(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked %v", chunked), func(t *testing.T) {
			rules, err := ParseRules("COPY,PUT /files/{id} fence file:{id}")
			if err != nil {
				t.Fatal(err)
			}
			st := memstore.New(memstore.Options{})
			up := &recorder{}
			upSrv := httptest.NewServer(up)
			defer upSrv.Close()
			base, _ := url.Parse(upSrv.URL + "/base")
			g, err := New(Options{Upstream: base, Store: st, Rules: rules})
			if err != nil {
				t.Fatal(err)
			}
			srv := serveGate(t, g)
			ctx := context.Background()
			a, _ := st.Acquire(ctx, fencing.AcquireRequest{Resource: "file:a", Owner: "w", TTL: time.Minute})
			b, _ := st.Acquire(ctx, fencing.AcquireRequest{Resource: "file:b", Owner: "w", TTL: time.Minute})
			for _, dest := range []string{"/files/b", "http://" + strings.TrimPrefix(srv.URL, "http://") + "/files/b"} {
				req, _ := http.NewRequest("COPY", srv.URL+"/files/a", strings.NewReader("x"))
				if chunked {
					req.ContentLength = -1
					req.Body = io.NopCloser(strings.NewReader("x"))
				}
				req.Header.Set(HeaderToken, tok(a.Token))
				req.Header.Set(HeaderDestination, dest)
				req.Header.Set(HeaderDestinationToken, tok(b.Token))
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("COPY /files/a to %s: %d", dest, resp.StatusCode)
				}
			}
			got := up.requests()
			if len(got) != 2 {
				t.Fatalf("the upstream got %d requests, want 2", len(got))
			}
			for _, r := range got {
				if r.Path != "/base/files/a" || r.Header.Get(HeaderDestination) != "/base/files/b" {
					t.Errorf("the upstream got COPY %s to %q, want /base/files/a to /base/files/b", r.Path, r.Header.Get(HeaderDestination))
				}
			}
		})
	}
}

// TestResourceHeaderFollowsTheRulesInForce: with ResourceHeaderWithoutRules
// (the binary's default), the Fencing-Resource fallback is on while the
// rules in force are none and off once a reload brings some, and back on
// when a reload takes them all away; ResourceHeader keeps it on.
func TestResourceHeaderFollowsTheRulesInForce(t *testing.T) {
	rules, err := ParseRules("PUT /files/{id} fence file:{id}")
	if err != nil {
		t.Fatal(err)
	}
	up, _ := url.Parse("http://upstream:1")
	write := Incoming{Method: "PUT", Target: "/other/1", Host: "gate", Header: http.Header{HeaderToken: {"3"}, HeaderResource: {"scratch:1"}}}
	for _, c := range []struct {
		always     bool
		rules      []Rule
		wantHeader bool // the write is fenced on scratch:1
	}{
		{false, nil, true},
		{false, rules, false},
		{false, []Rule{}, true},
		{true, rules, true},
	} {
		g, err := New(Options{Upstream: up, Store: memstore.New(memstore.Options{}), ResourceHeader: c.always, ResourceHeaderWithoutRules: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.SetRules(c.rules); err != nil {
			t.Fatal(err)
		}
		d := g.decide(write)
		fenced := d.Verdict == Fence && len(d.Targets) == 1 && d.Targets[0].Resource == "scratch:1"
		if fenced != c.wantHeader {
			t.Errorf("ResourceHeader %v, %d rules in force: %+v; want the header's resource used: %v", c.always, len(c.rules), d, c.wantHeader)
		}
	}
}

// BenchmarkDecide is the decision alone for a fenced write: as the event
// loops give it (the headers decide reads: the token), and as the general
// engine gives it (every header the client sent).
//
//	go test -run '^$' -bench Decide -benchmem ./proxy
func BenchmarkDecide(b *testing.B) {
	rules, err := ParseRules("PUT /jobs/{id} fence job:{id}")
	if err != nil {
		b.Fatal(err)
	}
	up, _ := url.Parse("http://upstream:1")
	g, err := New(Options{Upstream: up, Store: memstore.New(memstore.Options{}), Rules: rules})
	if err != nil {
		b.Fatal(err)
	}
	full := http.Header{
		"Accept": {"*/*"}, "Content-Type": {"application/json"}, "User-Agent": {"bench/1"},
		"X-Request-Id": {"abc"}, "X-Forwarded-For": {"10.0.0.1"}, "Accept-Encoding": {"gzip"},
		HeaderToken: {"1796631549936590"},
	}
	for name, h := range map[string]http.Header{"loops": {HeaderToken: {"1796631549936590"}}, "general": full} {
		b.Run(name, func(b *testing.B) {
			in := Incoming{Method: http.MethodPut, Target: "/jobs/17", Host: "app:8080", Header: h}
			for b.Loop() {
				if d := g.decide(in); d.Verdict != Fence {
					b.Fatalf("verdict %v: %v", d.Verdict, d.Problem)
				}
			}
		})
	}
}

// TestSuspectHeaders: one walk over a request's header names finds each
// kind of header an upstream might honour in place of what the gate
// judges, in any spelling, beside any number of innocent ones.
func TestSuspectHeaders(t *testing.T) {
	innocent := []string{"Accept", "Fencing-Token", "Fencing-Resource", "X-Forwarded-For", "X-Request-Id", "Fencing-Tokens", "X-Http-Method-Overrides", "Xhttp-Method", "F", "X"}
	for _, c := range []struct {
		names []string
		want  suspects
	}{
		{nil, suspects{}},
		{[]string{"X-Http-Method-Override"}, suspects{methodOverride: "X-Http-Method-Override"}},
		{[]string{"x_http_method"}, suspects{methodOverride: "x_http_method"}},
		{[]string{"X-METHOD-OVERRIDE"}, suspects{methodOverride: "X-METHOD-OVERRIDE"}},
		{[]string{"X-Original-Url"}, suspects{pathOverride: "X-Original-Url"}},
		{[]string{"x_rewrite_url"}, suspects{pathOverride: "x_rewrite_url"}},
		{[]string{"Fencing_Token"}, suspects{fencingAlias: "Fencing_Token"}},
		{[]string{"fencing_destination-token"}, suspects{fencingAlias: "fencing_destination-token"}},
		{[]string{"FENCING_RESOURCE", "X-Rewrite-Url", "X_Http_Method"},
			suspects{methodOverride: "X_Http_Method", pathOverride: "X-Rewrite-Url", fencingAlias: "FENCING_RESOURCE"}},
	} {
		h := http.Header{}
		for _, n := range innocent {
			h[n] = []string{"1"}
		}
		for _, n := range c.names {
			h[n] = []string{"1"}
		}
		if got := suspectHeaders(h); got != c.want {
			t.Errorf("%q: got %+v, want %+v", c.names, got, c.want)
		}
	}
}
