package leaseapi_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/certs/certstest"
	"github.com/fencegate/fencegate/internal/syncbuf"
	"github.com/fencegate/fencegate/leaseapi"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// accessDoc: two worker pools bound to their names and prefixes, and a
// reader of everything.
var accessDoc = fmt.Sprintf(`clients:
  - name: pool-a
    token_sha256: %s
    allow: [{prefix: "job:a:", ops: [acquire, renew, release, checkpoint, read]}]
    bind_owner: true
  - name: pool-b
    token_sha256: %s
    allow: [{prefix: "job:b:", ops: [acquire, renew, release, checkpoint, read]}]
    bind_owner: true
  - name: reader
    token_sha256: %s
    allow: [{prefix: "", ops: [read]}]
`, access.HashToken("tok-a"), access.HashToken("tok-b"), access.HashToken("tok-r"))

// newAccessEnv serves the API with accessDoc, and with each of more
// applied to its options.
func newAccessEnv(t *testing.T, more ...func(*leaseapi.Options)) *env {
	t.Helper()
	p, err := access.Parse([]byte(accessDoc))
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(t, storeKinds[0], func(o *leaseapi.Options) {
		o.Access = access.Static(p)
		for _, f := range more {
			f(o)
		}
	})
}

func bearerOf(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

func TestAccessPoolsCannotTouchEachOther(t *testing.T) {
	e := newAccessEnv(t)
	const js = "application/json"
	a := e.req("POST", "/v1/leases/job:a:1/acquire", js, `{"owner":"pool-a/w1"}`, bearerOf("tok-a")...)
	if a.status != 200 {
		t.Fatalf("pool-a acquires its own: %d %s", a.status, a.raw)
	}
	tokA := a.num("token")
	body := func(owner string) string { return fmt.Sprintf(`{"owner":%q,"token":%d}`, owner, tokA) }
	// pool-b, knowing pool-a's owner and token, can do nothing to it.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/leases/job:a:1/acquire", `{"owner":"pool-b/w1"}`},
		{"POST", "/v1/leases/job:a:1/renew", body("pool-a/w1")},
		{"POST", "/v1/leases/job:a:1/release", body("pool-a/w1")},
		{"PUT", "/v1/leases/job:a:1/checkpoint", `{"owner":"pool-a/w1","token":` + fmt.Sprint(tokA) + `,"state":1}`},
		{"GET", "/v1/leases/job:a:1", ""},
		{"GET", "/v1/leases/job:a:1/checkpoint", ""},
		// Its own prefix, but another's owner (bind_owner).
		{"POST", "/v1/leases/job:b:1/acquire", `{"owner":"pool-a/w1"}`},
		{"POST", "/v1/leases/job:b:1/acquire", `{"owner":"pool-bx"}`},
	} {
		ct := ""
		if c.body != "" {
			ct = js
		}
		got := e.req(c.method, c.path, ct, c.body, bearerOf("tok-b")...)
		if got.status != 403 || got.str("code") != "forbidden" || strings.Contains(string(got.raw), "pool-a/w1\"") && c.method == "GET" {
			t.Errorf("pool-b %s %s: %d %s; want 403 forbidden", c.method, c.path, got.status, got.raw)
		}
		if strings.Contains(string(got.raw), fmt.Sprint(tokA)) {
			t.Errorf("pool-b %s %s: the answer reveals pool-a's token: %s", c.method, c.path, got.raw)
		}
	}
	// Nothing was done: pool-a's lease is live with its token, no checkpoint.
	st := e.req("GET", "/v1/leases/job:a:1", "", "", bearerOf("tok-r")...)
	if st.status != 200 || st.obj("lease") == nil || st.obj("checkpoint") != nil {
		t.Fatalf("status after pool-b's tries: %s", st.raw)
	}
	if got := e.req("GET", "/v1/leases/job:b:1", "", "", bearerOf("tok-r")...); got.obj("lease") != nil {
		t.Fatalf("a forbidden acquire took job:b:1: %s", got.raw)
	}
	// pool-a renews and releases its own.
	if got := e.req("POST", "/v1/leases/job:a:1/renew", js, body("pool-a/w1"), bearerOf("tok-a")...); got.status != 200 {
		t.Fatalf("pool-a renew: %d %s", got.status, got.raw)
	}
	// Through the Go client: a refusal matching ErrForbidden.
	_, err := leaseapi.NewClient(e.srv.URL, leaseapi.WithToken("tok-b")).Status(context.Background(), "job:a:1")
	if !errors.Is(err, leaseapi.ErrForbidden) {
		t.Fatalf("Go client, pool-b status of job:a:1: %v, want ErrForbidden", err)
	}
	// The reader may read but not act.
	if got := e.req("POST", "/v1/leases/job:a:1/release", js, body("pool-a/w1"), bearerOf("tok-r")...); got.status != 403 {
		t.Fatalf("reader release: %d %s", got.status, got.raw)
	}
}

func TestAccessListsAreFiltered(t *testing.T) {
	e := newAccessEnv(t)
	const js = "application/json"
	for _, c := range []struct{ tok, res, owner string }{
		{"tok-a", "job:a:1", "pool-a"}, {"tok-a", "job:a:2", "pool-a/x"}, {"tok-b", "job:b:1", "pool-b"},
	} {
		if got := e.req("POST", "/v1/leases/"+c.res+"/acquire", js, `{"owner":"`+c.owner+`"}`, bearerOf(c.tok)...); got.status != 200 {
			t.Fatalf("acquire %s: %d %s", c.res, got.status, got.raw)
		}
	}
	list := func(tok, query string) string {
		got := e.req("GET", "/v1/leases"+query, "", "", bearerOf(tok)...)
		if got.status != 200 {
			t.Fatalf("list %s as %s: %d %s", query, tok, got.status, got.raw)
		}
		var names []string
		for _, l := range got.body["leases"].([]any) {
			names = append(names, l.(map[string]any)["resource"].(string))
		}
		return strings.Join(names, ",")
	}
	for _, c := range []struct{ tok, query, want string }{
		{"tok-a", "", "job:a:1,job:a:2"},
		{"tok-a", "?prefix=job:", "job:a:1,job:a:2"},
		{"tok-a", "?prefix=jo", "job:a:1,job:a:2"},
		{"tok-a", "?prefix=job:a:2", "job:a:2"},
		{"tok-a", "?prefix=job:b:", ""},
		{"tok-a", "?limit=1", "job:a:1"},
		{"tok-b", "", "job:b:1"},
		{"tok-r", "", "job:a:1,job:a:2,job:b:1"},
	} {
		if got := list(c.tok, c.query); got != c.want {
			t.Errorf("list%s as %s: %q, want %q", c.query, c.tok, got, c.want)
		}
	}
}

func TestAccessUnknownCredentialsAndRateLimit(t *testing.T) {
	e := newAccessEnv(t)
	now := time.Unix(1000, 0)
	leaseapi.SetLimiter(e.api, access.NewLimiter(4, 10*time.Second, func() time.Time { return now }))
	for _, hdr := range [][]string{nil, bearerOf("tok-x"), bearerOf("tok-ab"), {"Authorization", "Basic dG9rLWE="}} {
		got := e.req("GET", "/v1/leases/job:a:1", "", "", hdr...)
		if got.status != 401 || got.str("code") != "unauthorized" {
			t.Fatalf("credentials %v: %d %s", hdr, got.status, got.raw)
		}
	}
	// The burst of 4 is spent: the address is refused before its
	// credentials are looked at.
	got := e.req("GET", "/v1/leases/job:a:1", "", "", bearerOf("tok-a")...)
	if got.status != 429 || got.header.Get("Retry-After") != "10" {
		t.Fatalf("after 4 failures, even a good token: %d Retry-After %q %s; want 429, 10", got.status, got.header.Get("Retry-After"), got.raw)
	}
	// Health and metrics stay open.
	if got := e.req("GET", "/livez", "", ""); got.status != 200 {
		t.Fatalf("livez: %d", got.status)
	}
	now = now.Add(10 * time.Second)
	if got := e.req("GET", "/v1/leases/job:a:1", "", "", bearerOf("tok-a")...); got.status != 200 {
		t.Fatalf("after the refill: %d %s", got.status, got.raw)
	}
}

// The access log names the access file's client of each call.
func TestAccessLogNamesTheClient(t *testing.T) {
	var logs syncbuf.Buffer
	e := newAccessEnv(t, func(o *leaseapi.Options) {
		o.AccessLog = true
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	e.req("GET", "/v1/leases/job:a:1", "", "", bearerOf("tok-a")...)
	e.req("GET", "/v1/leases/job:a:1", "", "", bearerOf("tok-b")...)
	e.req("GET", "/v1/leases/job:a:1", "", "", bearerOf("nobody")...)
	out := logs.String()
	for _, want := range []string{`"status":200,"duration_ms"`, `"client_name":"pool-a"`, `"status":403`, `"client_name":"pool-b"`, `"status":401`} {
		if !strings.Contains(out, want) {
			t.Errorf("access log lacks %s:\n%s", want, out)
		}
	}
	if strings.Count(out, `"client_name"`) < 2 || strings.Contains(out, `"client_name":""`) {
		t.Errorf("access log client names:\n%s", out)
	}
}

// A flood of refused calls logs at most RefusalLinesPerSecond refusal
// lines a second, while every call is still answered as refused.
func TestRefusalLinesBounded(t *testing.T) {
	var logs syncbuf.Buffer
	e := newAccessEnv(t, func(o *leaseapi.Options) { o.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	const calls = 5 * leaseapi.RefusalLinesPerSecond
	first := time.Now().Unix()
	for i := range calls {
		if got := e.req("GET", "/v1/leases/job:a:1", "", "", bearerOf("tok-b")...); got.status != 403 {
			t.Fatalf("call %d: %d %s, want 403", i, got.status, got.raw)
		}
	}
	seconds := time.Now().Unix() - first + 1 // the wall-clock seconds the flood touched
	lines := int64(strings.Count(logs.String(), `"msg":"lease API refusal"`))
	if lines == 0 || lines > leaseapi.RefusalLinesPerSecond*seconds {
		t.Fatalf("%d refusal lines over %d second(s), want 1 to %d a second", lines, seconds, leaseapi.RefusalLinesPerSecond)
	}
}

// Failed authentications are counted per client as the connection limits
// count them: an IPv6 client by its /64 (it can pick any address in it),
// an IPv4-mapped IPv6 address as the IPv4 one. A guesser cycling through
// its /64 is held to one allowance.
func TestAccessRateLimitIPv6Prefix(t *testing.T) {
	e := newAccessEnv(t)
	now := time.Unix(1000, 0)
	leaseapi.SetLimiter(e.api, access.NewLimiter(3, 10*time.Second, func() time.Time { return now }))
	call := func(remote, tok string) int {
		r := httptest.NewRequest("GET", "/v1/leases/job:a:1", nil)
		r.RemoteAddr = remote
		r.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		e.api.ServeHTTP(w, r)
		return w.Code
	}
	for i, remote := range []string{"[2001:db8::1]:1000", "[2001:db8::2]:1000", "[2001:db8:0:0:ffff::3%eth0]:1000"} {
		if got := call(remote, "guess"); got != 401 {
			t.Fatalf("guess %d from %s: %d, want 401", i, remote, got)
		}
	}
	if got := call("[2001:db8::4]:1000", "guess"); got != 429 {
		t.Fatalf("a fourth guess from another address of the same /64: %d, want 429", got)
	}
	if got := call("[2001:db8:0:1::1]:1000", "tok-a"); got != 200 {
		t.Fatalf("another /64: %d, want 200", got)
	}
	for i, remote := range []string{"192.0.2.7:1000", "[::ffff:192.0.2.7]:1000", "192.0.2.7:2000"} {
		if got := call(remote, "guess"); got != 401 {
			t.Fatalf("IPv4 guess %d from %s: %d, want 401", i, remote, got)
		}
	}
	if got := call("[::ffff:192.0.2.7]:3000", "guess"); got != 429 {
		t.Fatalf("IPv4-mapped after 3 IPv4 guesses: %d, want 429", got)
	}
}

// Over mutual TLS, a client certificate whose SANs name two clients of the
// access file (here a reader's DNS name on an admin's SPIFFE ID) is
// refused 401 and nothing is done; one naming a single client is that
// client.
func TestAccessCertificateNamingTwoClients(t *testing.T) {
	set := certstest.New(t)
	p, err := access.Parse([]byte(`clients:
  - {name: reporting, cert_dns: reporting.ops.svc, allow: [{prefix: "", ops: [read]}]}
  - {name: admin, cert_uri: "spiffe://corp/admin", allow: [{prefix: "", ops: [acquire, read]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.Options{})
	api := leaseapi.NewServer(leaseapi.Options{Store: store, Access: access.Static(p)})
	srv := httptest.NewUnstartedServer(api)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{set.Server.TLS(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: set.CA.Pool()}
	srv.StartTLS()
	defer srv.Close()
	ctx := context.Background()
	as := func(o certstest.ClientOptions) *leaseapi.Client {
		return leaseapi.NewClient(srv.URL, leaseapi.WithTLSConfig(&tls.Config{RootCAs: set.CA.Pool(), Certificates: []tls.Certificate{set.CA.Client(t, o).TLS(t)}}))
	}
	both := as(certstest.ClientOptions{URIs: []string{"spiffe://corp/admin"}, DNSNames: []string{"reporting.ops.svc"}})
	if _, err := both.Acquire(ctx, "job:1", leaseapi.AcquireOptions{Owner: "w"}); !errors.Is(err, leaseapi.ErrUnauthorized) {
		t.Fatalf("acquire by a certificate naming admin and reporting: %v, want ErrUnauthorized", err)
	}
	reporting := as(certstest.ClientOptions{DNSNames: []string{"other.example", "reporting.ops.svc"}})
	st, err := reporting.Status(ctx, "job:1")
	if err != nil || st.Lease != nil {
		t.Fatalf("reporting's status of job:1: %+v %v, want no lease", st, err)
	}
	if _, err := reporting.Acquire(ctx, "job:1", leaseapi.AcquireOptions{Owner: "w"}); !errors.Is(err, leaseapi.ErrForbidden) {
		t.Fatalf("reporting acquires: %v, want ErrForbidden", err)
	}
}

// Guesses sent at once get no more 401s
// (answers that a guess was wrong) than the allowance: the others are 429,
// however their checks interleave. (Many clients make each token lookup
// long, widening the time between an address's allowance being looked at
// and a failure being counted.)
func TestAccessRateLimitConcurrentGuesses(t *testing.T) {
	var doc strings.Builder
	doc.WriteString(accessDoc)
	for i := range 20000 {
		fmt.Fprintf(&doc, "  - {name: c%d, token_sha256: %s, allow: [{prefix: \"\", ops: [read]}]}\n", i, access.HashToken(fmt.Sprint("t", i)))
	}
	p, err := access.Parse([]byte(doc.String()))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, storeKinds[0], func(o *leaseapi.Options) { o.Access = access.Static(p) })
	now := time.Unix(1000, 0)
	const burst = 3
	leaseapi.SetLimiter(e.api, access.NewLimiter(burst, time.Hour, func() time.Time { return now }))
	const guesses = 40
	start := make(chan struct{})
	codes := make(chan int, guesses)
	var wg sync.WaitGroup
	for i := range guesses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := httptest.NewRequest("GET", "/v1/leases/job:a:1", nil)
			r.RemoteAddr = "192.0.2.1:1000"
			r.Header.Set("Authorization", "Bearer guess-"+fmt.Sprint(i))
			w := httptest.NewRecorder()
			<-start
			e.api.ServeHTTP(w, r)
			codes <- w.Code
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	n := map[int]int{}
	for c := range codes {
		n[c]++
	}
	if n[401] > burst || n[401]+n[429] != guesses {
		t.Fatalf("%d guesses at once with an allowance of %d: %v; want at most %d 401s, the rest 429", guesses, burst, n, burst)
	}
	// The address is spent: a good token waits too.
	r := httptest.NewRequest("GET", "/v1/leases/job:a:1", nil)
	r.RemoteAddr = "192.0.2.1:1000"
	r.Header.Set("Authorization", "Bearer tok-a")
	w := httptest.NewRecorder()
	if e.api.ServeHTTP(w, r); w.Code != 429 {
		t.Fatalf("a good token after the allowance is spent: %d, want 429", w.Code)
	}
}

// A client known by its verified certificate is not held back by the
// failed authentications of its address: a certificate cannot be guessed,
// so refusing it would only let a token guesser on the same address (a
// shared host, a NAT) lock it out.
func TestAccessCertificateClientNotLockedOut(t *testing.T) {
	set := certstest.New(t)
	p, err := access.Parse([]byte(`clients:
  - {name: reporting, cert_dns: reporting.ops.svc, allow: [{prefix: "", ops: [read]}]}
  - {name: pool, token_sha256: ` + access.HashToken("tok") + `, allow: [{prefix: "", ops: [read]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	api := leaseapi.NewServer(leaseapi.Options{Store: memstore.New(memstore.Options{}), Access: access.Static(p)})
	now := time.Unix(1000, 0)
	leaseapi.SetLimiter(api, access.NewLimiter(2, time.Hour, func() time.Time { return now }))
	srv := httptest.NewUnstartedServer(api)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{set.Server.TLS(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: set.CA.Pool()}
	srv.StartTLS()
	defer srv.Close()
	ctx := context.Background()
	as := func(o certstest.ClientOptions, token string) *leaseapi.Client {
		opts := []leaseapi.ClientOption{leaseapi.WithTLSConfig(&tls.Config{RootCAs: set.CA.Pool(), Certificates: []tls.Certificate{set.CA.Client(t, o).TLS(t)}})}
		if token != "" {
			opts = append(opts, leaseapi.WithToken(token))
		}
		return leaseapi.NewClient(srv.URL, opts...)
	}
	stranger := certstest.ClientOptions{DNSNames: []string{"stranger.example"}}
	guesser := as(stranger, "guess")
	for i := range 2 {
		if _, err := guesser.Status(ctx, "job:1"); !errors.Is(err, leaseapi.ErrUnauthorized) {
			t.Fatalf("guess %d: %v, want ErrUnauthorized", i+1, err)
		}
	}
	if _, err := guesser.Status(ctx, "job:1"); err == nil || errors.Is(err, leaseapi.ErrUnauthorized) {
		t.Fatalf("a third guess: %v, want 429", err)
	}
	if _, err := as(stranger, "tok").Status(ctx, "job:1"); err == nil {
		t.Fatal("a good token from the spent address was served")
	}
	if _, err := as(stranger, "").Status(ctx, "job:1"); err == nil {
		t.Fatal("a certificate naming no client was served")
	}
	if _, err := as(certstest.ClientOptions{DNSNames: []string{"reporting.ops.svc"}}, "").Status(ctx, "job:1"); err != nil {
		t.Fatalf("reporting, by its certificate, from the spent address: %v, want served", err)
	}
}

// TestRefusalMetricCountsEveryV1Problem: fencegate_api_refusals_total
// counts every problem answer of a /v1 call by client and code, the
// router's 404 and 405 included (a client probing paths), and nothing
// outside /v1.
func TestRefusalMetricCountsEveryV1Problem(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newAccessEnv(t, func(o *leaseapi.Options) { o.MeterProvider = mp })
	for _, c := range []struct{ m, path string }{
		{"GET", "/v1/leases/job:a:1"},       // 403 forbidden
		{"GET", "/v1/leases/job:b:1/bogus"}, // 404 not-found
		{"DELETE", "/v1/leases/job:b:1"},    // 405 method-not-allowed
		{"GET", "/v1/nothing-here"},         // 404 not-found
		{"GET", "/nothing-here"},            // not a /v1 call
	} {
		e.req(c.m, c.path, "", "", bearerOf("tok-b")...)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != leaseapi.MetricRefusals {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				cl, _ := dp.Attributes.Value("client")
				code, _ := dp.Attributes.Value("code")
				got = append(got, fmt.Sprintf("%s/%s=%d", cl.AsString(), code.AsString(), dp.Value))
			}
		}
	}
	sort.Strings(got)
	if g, want := strings.Join(got, ","), "pool-b/forbidden=1,pool-b/method-not-allowed=1,pool-b/not-found=2"; g != want {
		t.Errorf("%s: %s; want %s", leaseapi.MetricRefusals, g, want)
	}
}

// TestAccessPathSpellingsCannotCrossPrefixes: pool-b, knowing pool-a's
// owner and token, sends request lines as written (raw, no client-side
// cleaning) that spell job:a:1 every way a path can (percent-encoding,
// dot segments, doubled slashes, NUL, case, parameters) on every route:
// no answer acts on or shows a resource outside job:b:, and job:a:1's
// lease is as pool-a left it.
func TestAccessPathSpellingsCannotCrossPrefixes(t *testing.T) {
	e := newAccessEnv(t)
	tok := e.req("POST", "/v1/leases/job:a:1/acquire", "application/json", `{"owner":"pool-a/w"}`, bearerOf("tok-a")...).num("token")
	send := func(method, target, body string) answer {
		t.Helper()
		c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer tok-b\r\n", method, target)
		if body != "" {
			head += fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
		}
		if _, err := io.WriteString(c, head+"\r\n"+body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
		if err != nil {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		defer resp.Body.Close()
		return decodeAnswer(resp)
	}
	names := []string{
		"job%3Aa%3A1", "job:a%3A1", "%6Aob:a:1", "job:b:..%2F..%2Fjob:a:1", "job:b:1%2F..%2F..%2Fjob:a:1",
		"job:a:1%00", "job:a:1%20", "JOB:A:1", "job:a:1.", "job%253Aa%253A1", "job:a:1;x", "job:a:1%3Bx",
		"job:b:%2e%2e", "job:b:1/../job:a:1", "job:b:1/..%2Fjob:a:1", "./job:a:1", "job:b:/../job:a:1",
	}
	owned := fmt.Sprintf(`{"owner":"pool-a/w","token":%d}`, tok)
	calls := []struct{ method, suffix, body string }{
		{"GET", "", ""}, {"HEAD", "", ""}, {"GET", "/checkpoint", ""}, {"GET", "/", ""},
		{"POST", "/release", owned}, {"POST", "/renew", owned}, {"POST", "/release/", owned},
		{"PUT", "/checkpoint", fmt.Sprintf(`{"owner":"pool-a/w","token":%d,"state":1}`, tok)},
		{"POST", "/acquire", `{"owner":"pool-b"}`},
	}
	for _, prefix := range []string{"/v1/leases/", "/v1//leases/", "//v1/leases/", "/v1/leases//", "/v1/./leases/", "/v1/x/../leases/"} {
		for _, n := range names {
			for _, c := range calls {
				target := prefix + n + c.suffix
				a := send(c.method, target, c.body)
				body := string(a.raw)
				if a.status/100 == 2 && (strings.Contains(body, "pool-a") || strings.Contains(body, "job:a:") || c.method != "HEAD" && !strings.Contains(body, `"resource":"job:b:`)) {
					t.Errorf("pool-b %s %s: %d %s", c.method, target, a.status, body)
				}
			}
		}
	}
	if st := e.req("GET", "/v1/leases/job:a:1", "", "", bearerOf("tok-a")...); st.obj("lease") == nil || st.obj("checkpoint") != nil || fmt.Sprint(st.obj("lease")["token"]) != fmt.Sprint(tok) {
		t.Fatalf("job:a:1 after pool-b's attempts: %s, want pool-a's lease (token %d), no checkpoint", st.raw, tok)
	}
}

// postAs sends a JSON POST as the client of bearer token tok; it may run
// outside the test's goroutine (no t.Fatal): a transport error is the
// answer's raw text, with status 0.
func postAs(e *env, tok, path, body string) answer {
	r, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return answer{raw: []byte(err.Error())}
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+tok)
	resp, err := e.srv.Client().Do(r)
	if err != nil {
		return answer{raw: []byte(err.Error())}
	}
	defer resp.Body.Close()
	return decodeAnswer(resp)
}

// TestAccessReloadRechecksWaitingAcquisitions: an acquisition with
// wait_seconds is judged again before each try after a wait, by the access
// file in force then. While pool-a waits, a reload narrows its prefix so
// the resource is no longer its own: when the holder lets go, it answers
// 403 forbidden with no lease ever taken for it, and the waiter behind it
// gets the lease. Then a reload removes pool-a: its wait ends in 401
// unauthorized, nothing taken. A reload that leaves the waiter its
// permission changes nothing: it gets the lease. Before, the permission
// checked when the call came held to the end of its wait.
func TestAccessReloadRechecksWaitingAcquisitions(t *testing.T) {
	doc := func(poolAPrefix string, withPoolA bool) string {
		d := fmt.Sprintf("clients:\n  - name: admin\n    token_sha256: %s\n    allow: [{prefix: \"\", ops: [acquire, renew, release, checkpoint, read]}]\n", access.HashToken("tok-admin"))
		if withPoolA {
			d += fmt.Sprintf("  - name: pool-a\n    token_sha256: %s\n    allow: [{prefix: %q, ops: [acquire, renew, release, checkpoint, read]}]\n    bind_owner: true\n", access.HashToken("tok-a"), poolAPrefix)
		}
		return d
	}
	file := filepath.Join(t.TempDir(), "access.yaml")
	write := func(d string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(d), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(doc("job:a:", true))
	f, err := access.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	e := newEnv(t, storeKinds[0], func(o *leaseapi.Options) {
		o.Access = f
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	// hold has the admin take res, and returns the body that releases it.
	hold := func(res string) string {
		t.Helper()
		a := postAs(e, "tok-admin", "/v1/leases/"+res+"/acquire", `{"owner":"adm","ttl_seconds":600}`)
		wantOK(t, "admin acquires "+res, a)
		return fmt.Sprintf(`{"owner":"adm","token":%d}`, a.num("token"))
	}
	// waitAs starts a waiting acquisition of res and returns once it is in
	// res's queue, n waiting in all.
	waitAs := func(tok, owner, res string, n int) chan answer {
		t.Helper()
		out := make(chan answer, 1)
		go func() {
			out <- postAs(e, tok, "/v1/leases/"+res+"/acquire", `{"owner":"`+owner+`","ttl_seconds":600,"wait_seconds":30}`)
		}()
		waitFor(t, owner+" to wait on "+res, func() bool { return leaseapi.Waiting(e.api, res) == n })
		return out
	}
	reload := func(d string) {
		t.Helper()
		write(d)
		if err := f.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	release := func(res, body string) {
		t.Helper()
		wantOK(t, "admin releases "+res, postAs(e, "tok-admin", "/v1/leases/"+res+"/release", body))
	}
	previous := func(res string) map[string]any {
		t.Helper()
		st := e.req("GET", "/v1/leases/"+res, "", "", bearerOf("tok-admin")...)
		wantOK(t, "status of "+res, st)
		return st.obj("previous")
	}

	// Narrowed: 403 before any lease is taken for it; the next waiter
	// served.
	rel := hold("job:a:w")
	refused := waitAs("tok-a", "pool-a/w", "job:a:w", 1)
	next := waitAs("tok-admin", "adm2", "job:a:w", 2)
	reload(doc("job:a:x:", true))
	release("job:a:w", rel)
	wantProblem(t, "pool-a's wait, after its prefix no longer covers job:a:w", <-refused, http.StatusForbidden, "forbidden")
	a := <-next
	wantOK(t, "the waiter behind pool-a", a)
	if a.str("owner") != "adm2" {
		t.Errorf("the waiter behind pool-a: %s, want adm2's lease", a.raw)
	}
	if prev := previous("job:a:w"); prev == nil || prev["owner"] != "adm" {
		t.Errorf("job:a:w's previous lease %v: want the admin's (pool-a never held it)", prev)
	}

	// Still allowed across a reload: served.
	rel = hold("job:a:x:1")
	kept := waitAs("tok-a", "pool-a/w", "job:a:x:1", 1)
	reload(doc("job:a:x:", true) + "  - name: reader\n    token_sha256: " + access.HashToken("tok-r") + "\n    allow: [{prefix: \"\", ops: [read]}]\n")
	release("job:a:x:1", rel)
	if a := <-kept; a.status != http.StatusOK || a.str("owner") != "pool-a/w" {
		t.Errorf("pool-a's wait, still allowed after a reload: %d %s, want its lease", a.status, a.raw)
	}

	// Removed: 401, nothing taken, nothing waiting behind it.
	rel = hold("job:a:x:2")
	gone := waitAs("tok-a", "pool-a/w", "job:a:x:2", 1)
	reload(doc("", false))
	release("job:a:x:2", rel)
	wantProblem(t, "pool-a's wait, after pool-a was removed", <-gone, http.StatusUnauthorized, "unauthorized")
	if prev := previous("job:a:x:2"); prev == nil || prev["owner"] != "adm" {
		t.Errorf("job:a:x:2's previous lease %v: want the admin's (pool-a never held it)", prev)
	}
	if st := e.req("GET", "/v1/leases/job:a:x:2", "", "", bearerOf("tok-admin")...); st.obj("lease") != nil {
		t.Errorf("job:a:x:2 is held after the refused wait: %s", st.raw)
	}
	for _, want := range []string{`"status":403,"code":"forbidden"`, `"status":401,"code":"unauthorized"`} {
		if !strings.Contains(logs.String(), `"msg":"lease API refusal"`) || !strings.Contains(logs.String(), want) {
			t.Errorf("no refusal line with %s:\n%s", want, logs.String())
		}
	}
}
