package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

const testRules = `
# jobs are fenced by id
PUT,PATCH,DELETE,COPY,MOVE /jobs/{id} fence job:{id}
POST             /jobs/{id}/finish fence strict job:{id}
POST             /health           pass
*                /admin/{rest...}  deny
`

// TestOutcomes walks every row of DESIGN §4's outcome table. For each
// refusal it also checks that the upstream received nothing.
func TestOutcomes(t *testing.T) {
	type tc struct {
		name    string
		noHdr   bool                  // ResourceHeader off
		setup   func(e *env) []string // returns extra headers
		method  string
		path    string
		status  int
		code    string            // problem code; empty for a forwarded request
		extra   map[string]string // problem extension members, as fmt %v
		retryOK bool              // Retry-After expected
		hdrs    []string          // more request headers, not checked upstream
	}
	holder := func(e *env) []string {
		l := e.acquire("job:7", "alice", 10*time.Second)
		return []string{HeaderToken, tok(l.Token)}
	}
	cases := []tc{
		{name: "admitted via rule", setup: holder, method: "PUT", path: "/jobs/7", status: 200},
		{name: "admitted via header", setup: func(e *env) []string {
			l := e.acquire("acct:9", "alice", 10*time.Second)
			return []string{HeaderToken, tok(l.Token), HeaderResource, "acct:9"}
		}, method: "POST", path: "/accounts/9/debit", status: 200},
		{name: "unknown method is fenced", setup: func(e *env) []string { return nil }, method: "PURGE", path: "/jobs/7", status: 428, code: "token-required"},
		{name: "safe method passes without token", setup: func(e *env) []string { return nil }, method: "GET", path: "/jobs/7", status: 200},
		{name: "pass rule needs no token", setup: func(e *env) []string { return nil }, method: "POST", path: "/health", status: 200},
		{name: "no token", setup: func(e *env) []string { return nil }, method: "PUT", path: "/jobs/7", status: 428, code: "token-required"},
		{name: "malformed token", setup: func(e *env) []string { return []string{HeaderToken, "01"} }, method: "PUT", path: "/jobs/7", status: 400, code: "invalid-token"},
		{name: "non-numeric token", setup: func(e *env) []string { return []string{HeaderToken, "abc"} }, method: "PUT", path: "/jobs/7", status: 400, code: "invalid-token"},
		{name: "two tokens", setup: func(e *env) []string { return []string{HeaderToken, "1", HeaderToken, "2"} }, method: "PUT", path: "/jobs/7", status: 400, code: "invalid-token"},
		{name: "no resource", setup: func(e *env) []string { return []string{HeaderToken, "1"} }, method: "POST", path: "/other", status: 400, code: "resource-required"},
		{name: "no resource, header mode off", noHdr: true, setup: func(e *env) []string {
			return []string{HeaderToken, "1", HeaderResource, "job:7"}
		}, method: "POST", path: "/other", status: 400, code: "resource-required"},
		{name: "invalid resource header", setup: func(e *env) []string {
			return []string{HeaderToken, "1", HeaderResource, "a/b"}
		}, method: "POST", path: "/other", status: 400, code: "resource-required"},
		{name: "template expands to an invalid name", setup: func(e *env) []string { return []string{HeaderToken, "1"} },
			method: "PUT", path: "/jobs/a%20b", status: 400, code: "resource-required"},
		{name: "dot segments", setup: func(e *env) []string { return []string{HeaderToken, "1"} },
			method: "PUT", path: "/jobs/%2E%2E", status: 400, code: "path-not-canonical"},
		{name: "encoded slash under a pass rule", setup: func(e *env) []string { return nil },
			method: "POST", path: "/health%2F..%2Fjobs%2F7", status: 400, code: "path-not-canonical"},
		{name: "upgrade on a write", setup: holder, method: "PUT", path: "/jobs/7", status: 403, code: "upgrade-denied",
			hdrs: []string{"Connection", "Upgrade", "Upgrade", "websocket"}},
		{name: "method override", setup: holder, method: "PUT", path: "/jobs/7", status: 403, code: "method-override-denied",
			hdrs: []string{"X-HTTP-Method-Override", "DELETE"}},
		{name: "method override on a read", setup: func(e *env) []string { return nil }, method: "GET", path: "/jobs/7", status: 403, code: "method-override-denied",
			hdrs: []string{"X-Http-Method", "PUT"}},
		{name: "stale token", setup: func(e *env) []string {
			a := e.acquire("job:7", "alice", 10*time.Second)
			e.clock.Advance(11 * time.Second)
			b := e.acquire("job:7", "bob", 10*time.Second)
			if _, err := e.store.Admit(context.Background(), fencing.AdmitRequest{Resource: "job:7", Token: b.Token}); err != nil {
				e.t.Fatal(err)
			}
			return []string{HeaderToken, tok(a.Token)}
		}, method: "PUT", path: "/jobs/7", status: 409, code: "stale-token", extra: map[string]string{"high_water_token": "2"}},
		{name: "token not issued", setup: func(e *env) []string {
			e.acquire("job:7", "alice", 10*time.Second)
			return []string{HeaderToken, "99"}
		}, method: "PUT", path: "/jobs/7", status: 409, code: "token-not-issued", extra: map[string]string{"issued_token": "1"}},
		{name: "strict, lease not live", setup: func(e *env) []string {
			a := e.acquire("job:7", "alice", 10*time.Second)
			e.clock.Advance(11 * time.Second)
			return []string{HeaderToken, tok(a.Token)}
		}, method: "POST", path: "/jobs/7/finish", status: 409, code: "lease-not-held"},
		{name: "strict, lease live", setup: holder, method: "POST", path: "/jobs/7/finish", status: 200},
		{name: "non-strict after expiry, nothing newer", setup: func(e *env) []string {
			a := e.acquire("job:7", "alice", 10*time.Second)
			e.clock.Advance(11 * time.Second)
			return []string{HeaderToken, tok(a.Token)}
		}, method: "PUT", path: "/jobs/7", status: 200},
		{name: "deny rule", setup: holder, method: "DELETE", path: "/admin/users/1", status: 403, code: "write-denied"},
		{name: "store unavailable", setup: func(e *env) []string {
			l := e.acquire("job:7", "alice", 10*time.Second)
			_ = e.store.Close()
			return []string{HeaderToken, tok(l.Token)}
		}, method: "PUT", path: "/jobs/7", status: 503, code: "store-unavailable", retryOK: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, testRules, func(o *Options) { o.ResourceHeader = !c.noHdr })
			hdr := c.setup(e)
			r := e.do(c.method, c.path, "body-of-"+c.name, append(append([]string(nil), hdr...), c.hdrs...)...)
			if c.code == "" {
				if r.Status != c.status || r.Header.Get("X-Upstream") != "yes" || r.Body != "applied body-of-"+c.name {
					t.Fatalf("got %d %q, want the upstream's %d", r.Status, r.Body, c.status)
				}
				got := e.up.requests()
				if len(got) != 1 || got[0].Body != "body-of-"+c.name || got[0].Method != c.method {
					t.Fatalf("upstream got %+v", got)
				}
				// Both fencing headers are forwarded unchanged.
				for i := 0; i+1 < len(hdr); i += 2 {
					if v := got[0].Header.Values(hdr[i]); len(v) != 1 || v[0] != hdr[i+1] {
						t.Fatalf("upstream got %s %q, want %q", hdr[i], v, hdr[i+1])
					}
				}
			} else {
				wantProblem(t, r, c.status, c.code)
				if n := e.up.count(); n != 0 {
					t.Fatalf("a refused write reached the upstream %d times: %+v", n, e.up.requests())
				}
			}
			for k, v := range c.extra {
				if got := fmt.Sprint(r.Problem[k]); got != v {
					t.Fatalf("%s = %s, want %s (%s)", k, got, v, r.Body)
				}
			}
			if got := r.Header.Get("Retry-After") != ""; got != c.retryOK {
				t.Fatalf("Retry-After present = %v, want %v", got, c.retryOK)
			}
			if n := e.gate.InFlightResources(); n != 0 {
				t.Fatalf("barrier still tracks %d resources", n)
			}
		})
	}
}

// TestZombieWorker is the story the product exists for: A's lease expires
// while A is paused, B takes over and writes, and A's late write is refused
// and never reaches the upstream.
func TestZombieWorker(t *testing.T) { forEachStore(t, testZombieWorker) }

func testZombieWorker(t *testing.T, e *env) {
	a := e.acquire("job:42", "worker-a", 10*time.Second)
	if r := e.do("PUT", "/jobs/42", "A step 1", HeaderToken, tok(a.Token)); r.Status != 200 {
		t.Fatalf("A's first write: %d %s", r.Status, r.Body)
	}
	e.clock.Advance(15 * time.Second) // A pauses past its TTL
	b := e.acquire("job:42", "worker-b", 10*time.Second)
	if b.Token <= a.Token {
		t.Fatalf("B's token %d is not above A's %d", b.Token, a.Token)
	}
	if r := e.do("PUT", "/jobs/42", "B step 1", HeaderToken, tok(b.Token)); r.Status != 200 {
		t.Fatalf("B's write: %d %s", r.Status, r.Body)
	}
	r := e.do("PUT", "/jobs/42", "A step 2 (zombie)", HeaderToken, tok(a.Token))
	wantProblem(t, r, 409, "stale-token")
	if r.Problem["high_water_token"] != float64(b.Token) {
		t.Fatalf("high_water_token = %v, want %d", r.Problem["high_water_token"], b.Token)
	}
	var bodies []string
	for _, g := range e.up.requests() {
		bodies = append(bodies, g.Body)
	}
	if strings.Join(bodies, "|") != "A step 1|B step 1" {
		t.Fatalf("upstream applied %q", bodies)
	}
}

// TestForgedToken: a token far above every issued token is refused and
// does not raise the high-water mark, so the real holder still writes.
func TestForgedToken(t *testing.T) { forEachStore(t, testForgedToken) }

func testForgedToken(t *testing.T, e *env) {
	l := e.acquire("job:1", "alice", 10*time.Second)
	r := e.do("PUT", "/jobs/1", "forged", HeaderToken, "18446744073709551615")
	wantProblem(t, r, 409, "token-not-issued")
	if r.Problem["issued_token"] != float64(l.Token) {
		t.Fatalf("issued_token = %v", r.Problem["issued_token"])
	}
	if r := e.do("PUT", "/jobs/1", "real", HeaderToken, tok(l.Token)); r.Status != 200 {
		t.Fatalf("the real holder was locked out: %d %s", r.Status, r.Body)
	}
	if got := e.up.requests(); len(got) != 1 || got[0].Body != "real" {
		t.Fatalf("upstream got %+v", got)
	}
}

// TestBarrierOrdersWrites: a slow write with a lower token is answered by
// the upstream before a higher-token write for the same resource arrives
// there. Without the barrier the higher write overtakes it, which the
// second subtest shows, so the first can fail.
func TestBarrierOrdersWrites(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		name := "barrier"
		if disabled {
			name = "no barrier (the overtaking the barrier prevents)"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, testRules)
			if disabled {
				e.gate.barrierOff = true
			}
			var mu sync.Mutex
			var events []string
			note := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
			arrived1, release1 := make(chan struct{}), make(chan struct{})
			arrived2 := make(chan struct{})
			e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
				note("arrive " + rec.Token)
				switch rec.Token {
				case "1":
					close(arrived1)
					<-release1
				case "2":
					close(arrived2)
				}
				note("done " + rec.Token)
				return false
			}
			a := e.acquire("job:5", "a", 10*time.Second)
			e.clock.Advance(11 * time.Second)
			b := e.acquire("job:5", "b", 10*time.Second)
			res1 := make(chan response, 1)
			go func() {
				r, _ := doReq(e.client, e.gateSrv.URL, "PUT", "/jobs/5", "one", HeaderToken, tok(a.Token))
				res1 <- r
			}()
			<-arrived1
			res2 := make(chan response, 1)
			go func() {
				r, _ := doReq(e.client, e.gateSrv.URL, "PUT", "/jobs/5", "two", HeaderToken, tok(b.Token))
				res2 <- r
			}()
			if disabled {
				<-arrived2 // overtakes the slow write
			} else {
				waitFor(t, "write 2 parked at the barrier", func() bool { return e.gate.registered("job:5", b.Token) == 1 })
			}
			close(release1)
			if r := <-res1; r.Status != 200 {
				t.Fatalf("write 1: %d %s", r.Status, r.Body)
			}
			if r := <-res2; r.Status != 200 {
				t.Fatalf("write 2: %d %s", r.Status, r.Body)
			}
			mu.Lock()
			got := strings.Join(events, ",")
			mu.Unlock()
			ordered := got == "arrive 1,done 1,arrive 2,done 2"
			if ordered == disabled {
				t.Fatalf("upstream events %s (barrier disabled: %v)", got, disabled)
			}
		})
	}
}

// TestEqualTokensOverlap: writes with the same token are not serialized:
// both are inside the upstream at once (a rendezvous, not timing).
func TestEqualTokensOverlap(t *testing.T) {
	e := newEnv(t, testRules)
	var wg sync.WaitGroup
	wg.Add(2)
	both := make(chan struct{})
	go func() { wg.Wait(); close(both) }()
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		wg.Done()
		select {
		case <-both:
			return false
		case <-time.After(10 * time.Second):
			w.WriteHeader(http.StatusTeapot) // the two never overlapped
			return true
		}
	}
	l := e.acquire("job:3", "a", 10*time.Second)
	errs := make(chan string, 2)
	for i := range 2 {
		go func() {
			r, err := doReq(e.client, e.gateSrv.URL, "PATCH", "/jobs/3", fmt.Sprint(i), HeaderToken, tok(l.Token))
			if err != nil || r.Status != 200 {
				errs <- fmt.Sprintf("write %d: %v %d %s", i, err, r.Status, r.Body)
				return
			}
			errs <- ""
		}()
	}
	for range 2 {
		if s := <-errs; s != "" {
			t.Fatal(s)
		}
	}
}

// TestBarrierTimeout: a write that waits too long behind a lower token is
// refused with 503 and never forwarded; the slow write still completes.
func TestBarrierTimeout(t *testing.T) {
	e := newEnv(t, testRules, func(o *Options) { o.BarrierTimeout = 20 * time.Millisecond })
	_, b, res1, release := e.slowHandoff()
	r := e.do("PUT", "/jobs/5", "two", HeaderToken, tok(b.Token))
	wantProblem(t, r, 503, "barrier-timeout")
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	close(release)
	if r := <-res1; r.Status != 200 {
		t.Fatalf("slow write: %d", r.Status)
	}
	if got := e.up.requests(); len(got) != 1 || got[0].Body != "one" {
		t.Fatalf("upstream got %+v", got)
	}
	waitFor(t, "the barrier to empty", func() bool { return e.gate.InFlightResources() == 0 })
}

// TestUpstreamDown: 502 upstream-unavailable; the write never left the
// gate, so the barrier opens at once.
func TestUpstreamDown(t *testing.T) {
	e := newEnv(t, testRules)
	dead := httptest.NewServer(http.NotFoundHandler())
	u, _ := url.Parse(dead.URL)
	dead.Close()
	g, err := New(Options{Upstream: u, Store: e.store, Rules: e.gateOpts.Rules})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveGate(t, g)
	defer srv.Close()
	l := e.acquire("job:1", "a", 10*time.Second)
	r, err := doReq(srv.Client(), srv.URL, "PUT", "/jobs/1", "x", HeaderToken, tok(l.Token))
	if err != nil {
		t.Fatal(err)
	}
	wantProblem(t, r, 502, "upstream-unavailable")
	if n := g.InFlightResources(); n != 0 {
		t.Fatalf("barrier holds %d resources after a write that was never sent", n)
	}
	r, _ = doReq(srv.Client(), srv.URL, "GET", "/jobs/1", "", HeaderToken, tok(l.Token))
	wantProblem(t, r, 502, "upstream-unavailable")
}

// TestUpstreamTimeout: 504 upstream-timeout, and the barrier then stays
// closed for higher tokens during the grace period (equal tokens still
// pass), and opens after it.
func TestUpstreamTimeout(t *testing.T) {
	setup := func(t *testing.T, grace time.Duration) (*env, fencing.Lease, fencing.Lease) {
		e := newEnv(t, testRules, func(o *Options) {
			// Long enough for the writes that get an answer on a busy
			// machine: only the "slow" one, which never gets one, times out.
			o.UpstreamTimeout = time.Second
			o.BarrierTimeout = 20 * time.Millisecond
			o.TimeoutGrace = grace
		})
		e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
			if rec.Body == "slow" {
				<-r.Context().Done() // the gate gives up and closes the connection
				return true
			}
			return false
		}
		a := e.acquire("job:9", "a", 10*time.Second)
		e.clock.Advance(11 * time.Second)
		b := e.acquire("job:9", "b", 10*time.Second)
		r := e.do("PUT", "/jobs/9", "slow", HeaderToken, tok(a.Token))
		wantProblem(t, r, 504, "upstream-timeout")
		return e, a, b
	}
	t.Run("closed during grace", func(t *testing.T) {
		e, a, b := setup(t, time.Hour)
		if r := e.do("PUT", "/jobs/9", "same token", HeaderToken, tok(a.Token)); r.Status != 200 {
			t.Fatalf("an equal-token write was held: %d %s", r.Status, r.Body)
		}
		r := e.do("PUT", "/jobs/9", "newer", HeaderToken, tok(b.Token))
		wantProblem(t, r, 503, "barrier-timeout")
		// Retry-After points at the end of the grace (an hour), not 1 s.
		if ra, _ := strconv.Atoi(r.Header.Get("Retry-After")); ra < 3500 || ra > 3600 {
			t.Fatalf("Retry-After %q during a one-hour grace", r.Header.Get("Retry-After"))
		}
		if r := e.do("PUT", "/jobs/10", "other resource", HeaderToken, "1"); r.Status != 409 {
			t.Fatalf("other resource: %d %s", r.Status, r.Body) // not issued, but not held by the barrier
		}
		for _, g := range e.up.requests() {
			if g.Body == "newer" {
				t.Fatal("the higher-token write was forwarded during the grace period")
			}
		}
		if n := e.gate.InFlightResources(); n != 1 {
			t.Fatalf("barrier tracks %d resources, want 1", n)
		}
	})
	t.Run("opens after grace", func(t *testing.T) {
		e, _, b := setup(t, 100*time.Millisecond)
		waitFor(t, "the grace period to end", func() bool { return e.gate.InFlightResources() == 0 })
		if r := e.do("PUT", "/jobs/9", "newer", HeaderToken, tok(b.Token)); r.Status != 200 {
			t.Fatalf("after the grace period: %d %s", r.Status, r.Body)
		}
	})
}

// TestStoreFailingNeverForwards: with the store closed every fenced write
// is refused 503, and the upstream is never called; safe requests still
// pass.
func TestStoreFailingNeverForwards(t *testing.T) { forEachStore(t, testStoreFailingNeverForwards) }

func testStoreFailingNeverForwards(t *testing.T, e *env) {
	l := e.acquire("job:1", "a", 10*time.Second)
	_ = e.store.Close()
	for _, m := range []string{"PUT", "PATCH", "DELETE"} {
		r := e.do(m, "/jobs/1", "x", HeaderToken, tok(l.Token))
		wantProblem(t, r, 503, "store-unavailable")
		if r.Header.Get("Retry-After") == "" {
			t.Fatal("no Retry-After")
		}
	}
	if n := e.up.count(); n != 0 {
		t.Fatalf("upstream called %d times", n)
	}
	if r := e.do("GET", "/jobs/1", ""); r.Status != 200 {
		t.Fatalf("GET: %d", r.Status)
	}
}

// TestClientGoneWhileWaiting: a write whose client leaves while it waits at
// the barrier is deregistered when its wait ends (the gate does not watch
// idle client connections: see Options.BarrierTimeout), and never
// forwarded.
func TestClientGoneWhileWaiting(t *testing.T) {
	e := newEnv(t, testRules, func(o *Options) { o.BarrierTimeout = time.Second })
	_, b, res1, release := e.slowHandoff()
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce() // a failure must not leave the upstream's handler waiting
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "PUT", e.gateSrv.URL+"/jobs/5", http.NoBody)
	req.Header.Set(HeaderToken, tok(b.Token))
	done := make(chan error, 1)
	go func() {
		resp, err := e.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, "write 2 parked", func() bool { return e.gate.registered("job:5", b.Token) == 1 })
	cancel()
	<-done
	waitFor(t, "write 2 deregistered", func() bool { return e.gate.registered("job:5", b.Token) == 0 })
	releaseOnce()
	<-res1
	waitFor(t, "the barrier to empty", func() bool { return e.gate.InFlightResources() == 0 })
	if got := e.up.requests(); len(got) != 1 {
		t.Fatalf("upstream got %+v", got)
	}
}

// TestXForwardedNotTrusted: the client's X-Forwarded-For is replaced.
func TestXForwardedNotTrusted(t *testing.T) {
	e := newEnv(t, testRules)
	e.do("GET", "/x", "", "X-Forwarded-For", "203.0.113.9", "X-Forwarded-Host", "evil.example")
	got := e.up.requests()
	if len(got) != 1 {
		t.Fatal(got)
	}
	if xff := got[0].Header.Get("X-Forwarded-For"); xff != "127.0.0.1" {
		t.Fatalf("X-Forwarded-For = %q", xff)
	}
	if h := got[0].Header.Get("X-Forwarded-Host"); h == "evil.example" {
		t.Fatalf("X-Forwarded-Host relayed from the client")
	}
}

// TestRequestBodyStreams: the upstream reads the first part of a write's
// body before the client has sent the rest, so the gate does not buffer
// bodies whole.
func TestRequestBodyStreams(t *testing.T) {
	e := newEnv(t, testRules)
	first := make(chan string, 1)
	e.up.handle = nil
	streamSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		first <- string(buf)
		rest, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, string(buf)+string(rest))
	}))
	defer streamSrv.Close()
	u, _ := url.Parse(streamSrv.URL)
	g, err := New(Options{Upstream: u, Store: e.store, Rules: e.gateOpts.Rules})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveGate(t, g)
	defer srv.Close()
	l := e.acquire("job:1", "a", 10*time.Second)
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("PUT", srv.URL+"/jobs/1", pr)
	req.Header.Set(HeaderToken, tok(l.Token))
	type result struct {
		body string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err != nil {
			res <- result{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- result{body: string(b)}
	}()
	if _, err := io.WriteString(pw, "hello"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-first:
		if got != "hello" {
			t.Fatalf("first part %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream did not see the first part before the body ended: the gate buffers")
	}
	_, _ = io.WriteString(pw, " world")
	pw.Close()
	if r := <-res; r.err != nil || r.body != "hello world" {
		t.Fatalf("got %q %v", r.body, r.err)
	}
}

// TestStreamedWriteHoldsTheBarrierUntilSentWhole: an upstream that answers
// a streamed write's headers at once and reads its body afterwards (a
// full-duplex call) does not open the barrier early: the next token is
// sent only once the first write's body has ended, and the upstream gets
// every byte of both (DESIGN §1.3). The gate's sends are seen by its
// beforeSend hook, the bytes by the upstream's own record. (When the
// upstream reads the first write's last bytes, against when it takes up
// the next write on another connection, is up to the upstream: the gate
// can order what it sends, not how the upstream schedules it.)
func TestStreamedWriteHoldsTheBarrierUntilSentWhole(t *testing.T) {
	e := newEnv(t, testRules)
	var mu sync.Mutex
	var events, gateEvents []string
	note := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
	noteGate := func(s string) { mu.Lock(); gateEvents = append(gateEvents, s); mu.Unlock() }
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tk := r.Header.Get(HeaderToken)
		if r.Header.Get("X-Duplex") != "" {
			if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
				t.Error(err)
			}
			w.WriteHeader(http.StatusOK) // the answer's head before the body is read
			w.(http.Flusher).Flush()
		}
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				note(tk + " got " + string(buf[:n]))
			}
			if err != nil {
				note(tk + " end " + fmt.Sprint(err))
				return
			}
		}
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	g, err := New(Options{Upstream: u, Store: e.store, Rules: e.gateOpts.Rules})
	if err != nil {
		t.Fatal(err)
	}
	sends := 0
	g.beforeSend = func() {
		mu.Lock()
		sends++
		n := sends
		mu.Unlock()
		noteGate(fmt.Sprint("gate sends write ", n))
	}
	srv := serveGate(t, g)
	a := e.acquire("job:5", "a", 10*time.Second)
	e.clock.Advance(11 * time.Second)
	b := e.acquire("job:5", "b", 10*time.Second)
	ta, tb := tok(a.Token), tok(b.Token)

	// a's write: its body streams, and the upstream answers at once.
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("PUT", srv.URL+"/jobs/5", pr)
	req.Header.Set(HeaderToken, ta)
	req.Header.Set("X-Duplex", "1")
	respA := make(chan *http.Response, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Error(err)
			close(respA)
			return
		}
		respA <- resp
	}()
	if _, err := io.WriteString(pw, "first"); err != nil {
		t.Fatal(err)
	}
	if resp := <-respA; resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a's write: %v", resp)
	} else {
		defer resp.Body.Close()
	}
	has := func(list *[]string, ev string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(*list, ev)
		}
	}
	waitFor(t, "a's first part at the upstream", has(&events, ta+" got first"))

	// b's write, while a's body is still coming: admitted, then it waits.
	resB := make(chan response, 1)
	go func() {
		r, _ := doReq(srv.Client(), srv.URL, "PUT", "/jobs/5", "second", HeaderToken, tb)
		resB <- r
	}()
	sentB := has(&gateEvents, "gate sends write 2")
	waitFor(t, "b's write admitted", func() bool {
		st, err := e.store.Status(context.Background(), "job:5")
		return sentB() || (err == nil && st.HighWater == b.Token && g.registered("job:5", b.Token) == 1)
	})
	noteGate("a's body ends")
	if _, err := io.WriteString(pw, "rest"); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if r := <-resB; r.Status != http.StatusOK {
		t.Fatalf("b's write: %d %s", r.Status, r.Body)
	}
	waitFor(t, "b's write at the upstream", has(&events, tb+" end EOF"))
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(gateEvents, ", "), "gate sends write 1, a's body ends, gate sends write 2"; got != want {
		t.Fatalf("the gate: %s; want %s", got, want)
	}
	var gotA, gotB []string
	for _, ev := range events {
		if strings.HasPrefix(ev, ta+" ") {
			gotA = append(gotA, ev)
		} else {
			gotB = append(gotB, ev)
		}
	}
	if got, want := strings.Join(gotA, ", "), ta+" got first, "+ta+" got rest, "+ta+" end EOF"; got != want {
		t.Fatalf("the upstream received of a's write: %s; want %s", got, want)
	}
	if got, want := strings.Join(gotB, ", "), tb+" got second, "+tb+" end EOF"; got != want {
		t.Fatalf("the upstream received of b's write: %s; want %s", got, want)
	}
}

// TestUpgradePassthrough: a WebSocket Upgrade on GET that an upgrade rule
// allows is tunnelled, also through the telemetry wrapper (which must keep
// the Hijacker). Upgrades no rule allows are refused: see TestHostileClients.
func TestUpgradePassthrough(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testUpgradePassthrough(t, Options{}, false) })
	t.Run("telemetry", func(t *testing.T) {
		testUpgradePassthrough(t, Options{
			MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
			TracerProvider: sdktrace.NewTracerProvider(),
		}, false)
	})
	t.Run("https upstream", func(t *testing.T) { testUpgradePassthrough(t, Options{}, true) })
}

func testUpgradePassthrough(t *testing.T, opts Options, useTLS bool) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		line, _ := brw.ReadString('\n')
		_, _ = brw.WriteString("echo " + line)
		_ = brw.Flush()
	}))
	if useTLS {
		up.StartTLS()
		opts.UpstreamTLS = upstreamTLS(up)
	} else {
		up.Start()
	}
	defer up.Close()
	u, _ := url.Parse(up.URL)
	opts.Upstream, opts.Store = u, memstore.New(memstore.Options{})
	rules, err := ParseRules("GET /ws upgrade websocket")
	if err != nil {
		t.Fatal(err)
	}
	opts.Rules = rules
	g, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := serveGate(t, g)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 101 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	_, _ = io.WriteString(conn, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "echo ping\n" {
		t.Fatalf("got %q %v", line, err)
	}
}

// upstreamTLS trusts the test server's certificate.
func upstreamTLS(s *httptest.Server) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(s.Certificate())
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// TestHTTPSUpstream: with an https upstream, a fenced write and a read go
// through over TLS, and a stale write is still refused.
func TestHTTPSUpstream(t *testing.T) {
	rc := &recorder{}
	up := httptest.NewTLSServer(rc)
	defer up.Close()
	u, _ := url.Parse(up.URL)
	rules, _ := ParseRules(testRules)
	st := memstore.New(memstore.Options{})
	g, err := New(Options{Upstream: u, Store: st, Rules: rules, UpstreamTLS: upstreamTLS(up)})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveGate(t, g)
	var targets []string
	rc.handle = func(w http.ResponseWriter, r *http.Request, _ received) bool {
		targets = append(targets, r.RequestURI) // under rc's lock
		return false
	}
	a, _ := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:1", Owner: "a", TTL: time.Minute})
	if r, err := doReq(srv.Client(), srv.URL, "PUT", "/jobs/1", "over tls", HeaderToken, tok(a.Token)); err != nil || r.Status != 200 {
		t.Fatalf("write over TLS: %v %+v", err, r)
	}
	if r, err := doReq(srv.Client(), srv.URL, "GET", "/x/a%2Fb%2e?q=%41", ""); err != nil || r.Status != 200 {
		t.Fatalf("read over TLS: %v %+v", err, r)
	}
	if r, _ := doReq(srv.Client(), srv.URL, "PUT", "/jobs/2", "x", HeaderToken, "0"); r.Status == 200 {
		t.Fatalf("an unissued token went through: %+v", r)
	}
	if got := rc.requests(); len(got) != 2 || got[0].Body != "over tls" || got[0].Token != tok(a.Token) {
		t.Fatalf("upstream got %+v", got)
	}
	if strings.Join(targets, " ") != "/jobs/1 /x/a%2Fb%2e?q=%41" {
		t.Fatalf("upstream got targets %q, not the bytes sent", targets)
	}
}

func TestNewValidates(t *testing.T) {
	st := memstore.New(memstore.Options{})
	u, _ := url.Parse("http://127.0.0.1:1")
	for name, o := range map[string]Options{
		"no upstream":   {Store: st},
		"relative":      {Upstream: &url.URL{Path: "/x"}, Store: st},
		"ftp":           {Upstream: &url.URL{Scheme: "ftp", Host: "h"}, Store: st},
		"no store":      {Upstream: u},
		"literal rule":  {Upstream: u, Store: st, Rules: []Rule{{Action: ActionPass, Pattern: "/x"}}},
		"negative wait": {Upstream: u, Store: st, BarrierTimeout: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := New(Options{Upstream: u, Store: st}); err != nil {
		t.Fatal(err)
	}
}
