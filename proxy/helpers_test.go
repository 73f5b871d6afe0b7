package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/problem"
)

// newFakeClock is the clock the tests move by hand.
func newFakeClock() *fencingtest.FakeClock {
	return fencingtest.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

// received is one request as the recording upstream saw it.
type received struct {
	Method, Path string
	Token        string // Fencing-Token as received
	Resource     string // Fencing-Resource as received
	Body         string
	Header       http.Header
}

// recorder is an upstream that records every request it receives and
// answers 200 "applied" (or what handle says).
type recorder struct {
	mu     sync.Mutex
	got    []received
	handle func(w http.ResponseWriter, r *http.Request, rec received) bool // true: handled
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec := received{Method: r.Method, Path: r.URL.Path, Token: r.Header.Get(HeaderToken),
		Resource: r.Header.Get(HeaderResource), Body: string(body), Header: r.Header.Clone()}
	rc.mu.Lock()
	rc.got = append(rc.got, rec)
	h := rc.handle
	rc.mu.Unlock()
	if h != nil && h(w, r, rec) {
		return
	}
	w.Header().Set("X-Upstream", "yes")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "applied "+rec.Body)
}

func (rc *recorder) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

func (rc *recorder) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

// env is a gate in front of a recording upstream, both on loopback.
type env struct {
	t        *testing.T
	clock    *fencingtest.FakeClock
	store    fencing.Store
	up       *recorder
	upSrv    *httptest.Server
	gate     *Gate
	gateSrv  *gateServer
	client   *http.Client
	gateOpts Options
}

type envOpt func(*Options)

func newEnv(t *testing.T, rules string, opts ...envOpt) *env {
	t.Helper()
	clock := newFakeClock()
	st := memstore.New(memstore.Options{Clock: clock})
	return newEnvStore(t, rules, st, clock, opts...)
}

func newEnvStore(t *testing.T, rules string, st fencing.Store, clock *fencingtest.FakeClock, opts ...envOpt) *env {
	t.Helper()
	e := &env{t: t, clock: clock, store: st, up: &recorder{}}
	e.upSrv = httptest.NewServer(e.up)
	t.Cleanup(e.upSrv.Close)
	rs, err := ParseRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(e.upSrv.URL)
	o := Options{Upstream: u, Store: st, Rules: rs, ResourceHeader: true}
	for _, f := range opts {
		f(&o)
	}
	e.gateOpts = o
	e.gate, err = New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.gateSrv = serveGate(t, e.gate)
	t.Cleanup(e.gateSrv.Close)
	e.client = e.gateSrv.Client()
	e.client.Timeout = 20 * time.Second
	return e
}

func (e *env) acquire(resource, owner string, ttl time.Duration) fencing.Lease {
	e.t.Helper()
	l, err := e.store.Acquire(context.Background(), fencing.AcquireRequest{Resource: resource, Owner: owner, TTL: ttl})
	if err != nil {
		e.t.Fatalf("acquire %s as %s: %v", resource, owner, err)
	}
	return l
}

// response is what a client saw.
type response struct {
	Status  int
	Header  http.Header
	Body    string
	Problem map[string]any // decoded when the body is problem+json
}

// do sends method path with body and headers (name, value pairs) to the
// gate.
func (e *env) do(method, path, body string, hdr ...string) response {
	e.t.Helper()
	r, err := doReq(e.client, e.gateSrv.URL, method, path, body, hdr...)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func doReq(c *http.Client, base, method, path, body string, hdr ...string) (response, error) {
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	out := response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
	if resp.Header.Get("Content-Type") == problem.ContentType {
		if err := json.Unmarshal(b, &out.Problem); err != nil {
			return response{}, err
		}
	}
	return out, nil
}

// wantProblem checks a refusal: status, code, and that the body is a
// complete problem document.
func wantProblem(t *testing.T, r response, status int, code string) {
	t.Helper()
	if r.Status != status || r.Problem == nil || r.Problem["code"] != code {
		t.Fatalf("got %d %q, want %d problem %q", r.Status, r.Body, status, code)
	}
	if r.Problem["type"] != problem.TypePrefix+code || r.Problem["status"] != float64(status) ||
		r.Problem["title"] == "" || r.Problem["detail"] == "" {
		t.Fatalf("incomplete problem document: %s", r.Body)
	}
}

func tok(t fencing.Token) string { return t.String() }

// waitFor polls cond every millisecond for up to 10 s; it fails the test if
// cond never holds. It is for states the test cannot be told about
// directly, such as a write parked at the barrier.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// registered reports how many writes with token tk are registered at the
// barrier for resource.
func (g *Gate) registered(resource string, tk fencing.Token) int {
	return g.barrier.Registered(resource, tk)
}

// slowHandoff sets up the handoff most barrier tests play on job:5: the
// upstream holds the first write (body "one") until release is closed;
// owner a takes the lease, it expires, owner b takes it; a's write (with
// the extra headers hdr) is sent and has reached the upstream when
// slowHandoff returns. res receives its response.
func (e *env) slowHandoff(hdr ...string) (a, b fencing.Lease, res <-chan response, release chan struct{}) {
	arrived, release := make(chan struct{}), make(chan struct{})
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		if rec.Body == "one" {
			close(arrived)
			<-release
		}
		return false
	}
	a = e.acquire("job:5", "a", 10*time.Second)
	e.clock.Advance(11 * time.Second)
	b = e.acquire("job:5", "b", 10*time.Second)
	res1 := make(chan response, 1)
	go func() {
		r, _ := doReq(e.client, e.gateSrv.URL, "PUT", "/jobs/5", "one", append([]string{HeaderToken, tok(a.Token)}, hdr...)...)
		res1 <- r
	}()
	<-arrived
	return a, b, res1, release
}

// gateServer is a Gate served by NewServer on a loopback listener, in the
// manner of httptest.Server.
type gateServer struct {
	URL      string
	Listener net.Listener
	srv      *Server
}

// serveGate serves g until the test ends.
func serveGate(t testing.TB, g *Gate) *gateServer {
	t.Helper()
	return serveGateWith(t, g, ServerOptions{})
}

// serveGateWith serves g with opts until the test ends.
func serveGateWith(t testing.TB, g *Gate, opts ServerOptions) *gateServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &gateServer{URL: "http://" + ln.Addr().String(), Listener: ln, srv: NewServer(g, opts)}
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(s.Close)
	return s
}

// Client is a client for the gate, with a pool large enough for the
// tests' concurrency.
func (s *gateServer) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
}

// Close stops the server, cutting off requests still in progress.
func (s *gateServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	_ = s.srv.Close()
}

// serveRaw listens on loopback until the test ends and hands each
// connection to serve, on a goroutine of its own.
func serveRaw(t *testing.T, serve func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, ln, serve)
}

// serveOn accepts on ln until the test ends and hands each connection to
// serve, on a goroutine of its own.
func serveOn(t *testing.T, ln net.Listener, serve func(net.Conn)) net.Listener {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln
}
