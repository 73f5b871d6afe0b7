package leaseapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/syncbuf"
	"github.com/fencegate/fencegate/leaseapi"
	"github.com/fencegate/fencegate/leaseapi/access"
)

func TestAuth(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("fencegate_up 1\n")) })
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, func(o *leaseapi.Options) { o.AuthToken = "s3cret-token"; o.Metrics = metrics })
		// Many failures from one address: the rate limit is tested on its own.
		leaseapi.SetLimiter(e.api, access.NewLimiter(1000, time.Second, nil))
		for _, c := range []struct {
			name, auth, challenge string
		}{
			{"no header", "", `Bearer realm="fencegate"`},
			{"wrong token", "Bearer s3cret-tokem", `Bearer realm="fencegate", error="invalid_token"`},
			{"prefix of token", "Bearer s3cret", `Bearer realm="fencegate", error="invalid_token"`},
			{"token plus more", "Bearer s3cret-token2", `Bearer realm="fencegate", error="invalid_token"`},
			{"basic scheme", "Basic czNjcmV0LXRva2Vu", `Bearer realm="fencegate"`},
			{"bare token", "s3cret-token", `Bearer realm="fencegate"`},
			{"empty bearer", "Bearer ", `Bearer realm="fencegate"`},
		} {
			for _, p := range []struct{ method, path, body string }{
				{"POST", "/v1/leases/job:1/acquire", `{"owner":"w"}`},
				{"GET", "/v1/leases/job:1", ""},
				{"GET", "/v1/leases", ""},
				{"GET", "/v1/no-such-thing", ""},
			} {
				a := e.req(p.method, p.path, "application/json", p.body, "Authorization", c.auth)
				wantProblem(t, c.name+" "+p.path, a, 401, "unauthorized")
				if got := a.header.Get("WWW-Authenticate"); got != c.challenge {
					t.Fatalf("%s: WWW-Authenticate %q, want %q", c.name, got, c.challenge)
				}
			}
		}
		// Two Authorization headers, even one of them right: which counts
		// would depend on who reads them.
		for _, auth := range [][]string{{"Bearer s3cret-token", "Bearer garbage"}, {"Bearer garbage", "Bearer s3cret-token"}} {
			a := e.req("POST", "/v1/leases/job:1/acquire", "application/json", `{"owner":"w"}`, "Authorization", auth[0], "Authorization", auth[1])
			wantProblem(t, "two Authorization headers", a, 400, "invalid-request")
			if got, want := a.header.Get("WWW-Authenticate"), `Bearer realm="fencegate", error="invalid_request"`; got != want {
				t.Fatalf("two Authorization headers: WWW-Authenticate %q, want %q", got, want)
			}
		}
		// Nothing was acquired by the refused calls.
		st := e.req("GET", "/v1/leases/job:1", "", "", "Authorization", "Bearer s3cret-token")
		wantOK(t, "authorized status", st)
		if st.num("issued_token") != 0 {
			t.Fatalf("an unauthorized acquire took effect: %s", st.raw)
		}
		for _, auth := range []string{"Bearer s3cret-token", "bearer s3cret-token", "BEARER  s3cret-token"} {
			wantOK(t, auth, e.req("POST", "/v1/leases/job:1/acquire", "application/json", `{"owner":"w"}`, "Authorization", auth))
		}
		// Health and metrics stay open.
		for _, p := range []string{"/livez", "/readyz", "/metrics"} {
			if a := e.get(p); a.status != http.StatusOK {
				t.Fatalf("%s with auth on: %d %s", p, a.status, a.raw)
			}
		}
		if a := e.get("/metrics"); string(a.raw) != "fencegate_up 1\n" {
			t.Fatalf("metrics body %q", a.raw)
		}
	})
}

func TestHealth(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		wantOK(t, "livez", e.get("/livez"))
		wantOK(t, "readyz", e.get("/readyz"))
		if a := e.req(http.MethodHead, "/livez", "", ""); a.status != http.StatusOK {
			t.Fatalf("HEAD /livez: %d", a.status)
		}
		e.api.SetDraining()
		wantProblem(t, "readyz draining", e.get("/readyz"), 503, "draining")
		wantOK(t, "livez draining", e.get("/livez"))
		// The API keeps serving in-flight work while draining.
		wantOK(t, "acquire while draining", e.post("/v1/leases/job:1/acquire", `{"owner":"w"}`))
	})
}

func TestRouting(t *testing.T) {
	e := newEnv(t, storeKinds[0], nil)
	wantProblem(t, "unknown path", e.get("/nope"), 404, "not-found")
	wantProblem(t, "unknown v1 path", e.get("/v1/leases/job:1/nope"), 404, "not-found")
	wantProblem(t, "metrics off", e.get("/metrics"), 404, "not-found")
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/leases/job:1/acquire", "POST"},
		{"DELETE", "/v1/leases/job:1", "GET, HEAD"},
		{"POST", "/v1/leases/job:1/checkpoint", "GET, PUT, HEAD"},
		{"POST", "/livez", "GET, HEAD"},
		{"PUT", "/v1/leases", "GET, HEAD"},
	} {
		a := e.req(c.method, c.path, "", "")
		wantProblem(t, c.method+" "+c.path, a, 405, "method-not-allowed")
		if got := a.header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}

	// Request ids: echoed when sane, generated otherwise.
	if got := e.req("GET", "/livez", "", "", "X-Request-Id", "trace-42").header.Get("X-Request-Id"); got != "trace-42" {
		t.Fatalf("X-Request-Id not echoed: %q", got)
	}
	if got := e.get("/v1/leases/bad$").header.Get("X-Request-Id"); got == "" {
		t.Fatal("no generated X-Request-Id on a problem")
	}
	long := strings.Repeat("r", 300)
	if got := e.req("GET", "/livez", "", "", "X-Request-Id", long).header.Get("X-Request-Id"); got == "" || got == long {
		t.Fatalf("oversize X-Request-Id not replaced: %q", got)
	}
}

// spyStore is a real store that reports refused acquires and can be made
// to panic, to observe waits and recovery from outside.
type spyStore struct {
	fencing.Store
	held  chan struct{} // receives (without blocking) after every lease-held refusal
	heldN atomic.Int32
	panic atomic.Bool
}

func (s *spyStore) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	if s.panic.Load() {
		panic("spy: boom")
	}
	l, err := s.Store.Acquire(ctx, req)
	if errors.Is(err, fencing.ErrLeaseHeld) {
		s.heldN.Add(1)
		select {
		case s.held <- struct{}{}:
		default:
		}
	}
	return l, err
}

func newSpyEnv(t *testing.T, k storeKind) (*env, *spyStore) {
	clock := newFakeClock()
	spy := &spyStore{Store: k.open(t, clock), held: make(chan struct{}, 1)}
	return newEnvWith(t, clock, spy, nil), spy
}

func TestAcquireWait(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		t.Run("waiter gets the lease after release", func(t *testing.T) {
			e, spy := newSpyEnv(t, k)
			wantOK(t, "holder", e.post("/v1/leases/job:1/acquire", `{"owner":"holder"}`))
			done := make(chan answer, 1)
			go func() {
				done <- e.reqNoFatal(http.MethodPost, "/v1/leases/job:1/acquire", `{"owner":"waiter","wait_seconds":30}`)
			}()
			select {
			case <-spy.held: // the waiter was refused once: it is waiting now
			case a := <-done:
				t.Fatalf("waiter answered before the holder released: %d %s", a.status, a.raw)
			}
			wantOK(t, "release", e.post("/v1/leases/job:1/release", `{"owner":"holder","token":1}`))
			a := <-done
			wantOK(t, "waiter", a)
			if a.str("owner") != "waiter" || a.num("token") != 2 {
				t.Fatalf("waiter got %s", a.raw)
			}
		})
		t.Run("bounded wait ends in lease-held", func(t *testing.T) {
			e, spy := newSpyEnv(t, k)
			wantOK(t, "holder", e.post("/v1/leases/job:1/acquire", `{"owner":"holder"}`))
			a := e.post("/v1/leases/job:1/acquire", `{"owner":"waiter","wait_seconds":1}`)
			wantProblem(t, "waiter", a, 409, "lease-held")
			if a.str("holder") != "holder" || a.header.Get("Retry-After") == "" {
				t.Fatalf("lease-held after wait: %s", a.raw)
			}
			if n := spy.heldN.Load(); n < 2 {
				t.Fatalf("the waiter tried %d times; a wait retries", n)
			}
		})
	})
}

// reqNoFatal is req for goroutines other than the test's: it reports
// transport errors as status 0 instead of calling t.Fatal.
func (e *env) reqNoFatal(method, path, body string) answer {
	r, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return answer{raw: []byte(err.Error())}
	}
	r.Header.Set("Content-Type", "application/json")
	resp, err := e.srv.Client().Do(r)
	if err != nil {
		return answer{raw: []byte(err.Error())}
	}
	defer resp.Body.Close()
	return decodeAnswer(resp)
}

func TestPanicBecomesProblem(t *testing.T) {
	e, spy := newSpyEnv(t, storeKinds[0])
	spy.panic.Store(true)
	wantProblem(t, "panicking store", e.post("/v1/leases/job:1/acquire", `{"owner":"w"}`), 500, "internal-error")
	spy.panic.Store(false)
	wantOK(t, "after panic", e.post("/v1/leases/job:1/acquire", `{"owner":"w"}`))
}

// TestFailuresLoggedWithRequestID checks DESIGN §5 on the API listener: an
// internal error says only "internal error", a store fault says nothing of
// its cause, and each cause is logged beside the request id the response
// carries.
func TestFailuresLoggedWithRequestID(t *testing.T) {
	var logs syncbuf.Buffer
	clock := newFakeClock()
	spy := &spyStore{Store: storeKinds[0].open(t, clock), held: make(chan struct{}, 1)}
	e := newEnvWith(t, clock, spy, func(o *leaseapi.Options) { o.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })

	spy.panic.Store(true)
	a := e.req(http.MethodPost, "/v1/leases/job:1/acquire", "application/json", `{"owner":"w"}`, "X-Request-Id", "req-panic-1")
	wantProblem(t, "panic", a, 500, "internal-error")
	if a.str("detail") != "internal error" || strings.Contains(string(a.raw), "boom") {
		t.Fatalf("panic answer says more than internal error: %s", a.raw)
	}
	spy.panic.Store(false)

	if err := spy.Store.Close(); err != nil {
		t.Fatal(err)
	}
	f := e.req(http.MethodGet, "/v1/leases/job:1", "", "", "X-Request-Id", "req-fault-2")
	wantProblem(t, "closed store", f, 503, "store-unavailable")

	lines := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if id, _ := m["request_id"].(string); id != "" {
			lines[id] = m
		}
	}
	if m := lines["req-panic-1"]; m == nil || !strings.Contains(fmt.Sprint(m["panic"]), "boom") {
		t.Errorf("panic not logged with its request id: %s", logs.String())
	}
	if m := lines["req-fault-2"]; m == nil || m["code"] != "store-unavailable" || m["error"] == nil {
		t.Errorf("store fault not logged with its cause and request id: %s", logs.String())
	}
	if detail := f.str("detail"); strings.Contains(detail, fmt.Sprint(lines["req-fault-2"]["error"])) {
		t.Errorf("store fault answer quotes its cause: %s", f.raw)
	}
}

func TestNewServerRejectsBadOptions(t *testing.T) {
	for name, o := range map[string]leaseapi.Options{
		"nil store":         {},
		"sub-second TTL":    {Store: memstore.New(memstore.Options{}), DefaultTTL: 500 * time.Millisecond},
		"TTL above 24h":     {Store: memstore.New(memstore.Options{}), DefaultTTL: 25 * time.Hour},
		"negative max size": {Store: memstore.New(memstore.Options{}), MaxCheckpointBytes: -1},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: NewServer did not panic", name)
				}
			}()
			leaseapi.NewServer(o)
		}()
	}
}

func TestDefaultTTLOption(t *testing.T) {
	e := newEnv(t, storeKinds[0], func(o *leaseapi.Options) { o.DefaultTTL = 90 * time.Second })
	if a := e.post("/v1/leases/job:1/acquire", `{"owner":"w"}`); a.num("ttl_seconds") != 90 {
		t.Fatalf("default TTL not used: %s", a.raw)
	}
	if a := e.post("/v1/leases/job:2/acquire", `{"owner":"w","ttl_seconds":null,"wait_seconds":null}`); a.num("ttl_seconds") != 90 {
		t.Fatalf("null ttl_seconds is not absent: %s", a.raw)
	}
}
