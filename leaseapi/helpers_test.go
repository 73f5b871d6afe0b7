package leaseapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/leaseapi"
)

// newFakeClock is the clock the tests move by hand.
func newFakeClock() *fencingtest.FakeClock {
	return fencingtest.NewFakeClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
}

// testMaxCheckpoint is the checkpoint state limit the tests give the
// stores, small so oversize cases stay cheap.
const testMaxCheckpoint = 1024

// storeKind opens one kind of real store for a test.
type storeKind struct {
	name string
	open func(t *testing.T, clock fencing.Clock) fencing.Store
}

// storeKinds are the stores every API table runs against.
var storeKinds = []storeKind{
	{"memstore", func(t *testing.T, clock fencing.Clock) fencing.Store {
		return memstore.New(memstore.Options{Clock: clock, MaxCheckpointBytes: testMaxCheckpoint})
	}},
	{"boltstore", func(t *testing.T, clock fencing.Clock) fencing.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{Clock: clock, MaxCheckpointBytes: testMaxCheckpoint, CountFromOne: true})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// forEachStore runs f once per store kind.
func forEachStore(t *testing.T, f func(t *testing.T, k storeKind)) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) { f(t, k) })
	}
}

// env is a real API server over a real store, on loopback.
type env struct {
	t     *testing.T
	clock *fencingtest.FakeClock
	store fencing.Store
	api   *leaseapi.Server
	srv   *httptest.Server
}

func newEnv(t *testing.T, k storeKind, edit func(*leaseapi.Options)) *env {
	t.Helper()
	clock := newFakeClock()
	store := k.open(t, clock)
	return newEnvWith(t, clock, store, edit)
}

func newEnvWith(t *testing.T, clock *fencingtest.FakeClock, store fencing.Store, edit func(*leaseapi.Options)) *env {
	t.Helper()
	opts := leaseapi.Options{Store: store, MaxCheckpointBytes: testMaxCheckpoint}
	if edit != nil {
		edit(&opts)
	}
	api := leaseapi.NewServer(opts)
	srv := httptest.NewServer(api)
	t.Cleanup(func() {
		srv.Close()
		_ = store.Close()
	})
	return &env{t: t, clock: clock, store: store, api: api, srv: srv}
}

// answer is a decoded response.
type answer struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

// str returns a string member of the body.
func (a answer) str(k string) string {
	s, _ := a.body[k].(string)
	return s
}

// num returns a numeric member of the body.
func (a answer) num(k string) int64 {
	n, ok := a.body[k].(json.Number)
	if !ok {
		return -1
	}
	v, err := n.Int64()
	if err != nil {
		return -1
	}
	return v
}

// obj returns an object member of the body, nil for null.
func (a answer) obj(k string) map[string]any {
	m, _ := a.body[k].(map[string]any)
	return m
}

// req sends a request. A non-empty contentType is sent as the header.
func (e *env) req(method, path, contentType, body string, hdr ...string) answer {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1]) // a name given twice is sent twice
	}
	resp, err := e.srv.Client().Do(r)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	return decodeAnswer(resp)
}

// decodeAnswer reads a response; a read error leaves status 0.
func decodeAnswer(resp *http.Response) answer {
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{raw: []byte(err.Error())}
	}
	a := answer{status: resp.StatusCode, header: resp.Header, raw: raw}
	if len(raw) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		_ = dec.Decode(&a.body)
	}
	return a
}

// post sends a JSON body.
func (e *env) post(path, body string) answer {
	e.t.Helper()
	return e.req(http.MethodPost, path, "application/json", body)
}

func (e *env) put(path, body string) answer {
	e.t.Helper()
	return e.req(http.MethodPut, path, "application/json", body)
}

func (e *env) get(path string) answer {
	e.t.Helper()
	return e.req(http.MethodGet, path, "", "")
}

// wantOK checks a 200 JSON answer.
func wantOK(t *testing.T, what string, a answer) {
	t.Helper()
	if a.status != http.StatusOK {
		t.Fatalf("%s: status %d, want 200; body %s", what, a.status, a.raw)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s: Content-Type %q, want application/json", what, ct)
	}
	if cc := a.header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("%s: Cache-Control %q, want no-store", what, cc)
	}
}

// wantProblem checks a problem+json answer with status and code.
func wantProblem(t *testing.T, what string, a answer, status int, code string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: status %d, want %d; body %s", what, a.status, status, a.raw)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%s: Content-Type %q, want application/problem+json", what, ct)
	}
	if got := a.str("code"); got != code {
		t.Fatalf("%s: code %q, want %q; body %s", what, got, code, a.raw)
	}
	if got := a.str("type"); got != "urn:fencegate:problem:"+code {
		t.Fatalf("%s: type %q", what, got)
	}
	if a.num("status") != int64(status) || a.str("title") == "" || a.str("detail") == "" {
		t.Fatalf("%s: incomplete problem %s", what, a.raw)
	}
	if cc := a.header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("%s: Cache-Control %q, want no-store", what, cc)
	}
}

// apiTime checks the API's time format: RFC 3339 UTC with milliseconds.
func apiTime(t *testing.T, what, s string) time.Time {
	t.Helper()
	if len(s) != len("2006-01-02T15:04:05.000Z") || !strings.HasSuffix(s, "Z") || s[19] != '.' {
		t.Fatalf("%s: time %q is not RFC 3339 UTC with milliseconds", what, s)
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}
