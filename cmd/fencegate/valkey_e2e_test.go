package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestGatesShareValkey runs two fencegate processes on one Valkey-compatible
// server, each gating the same upstream: a token superseded through one gate
// is refused by the other, because the high-water mark lives in the store.
func TestGatesShareValkey(t *testing.T) {
	server := valkeytest.Start(t)
	rec := &recorder{}
	upstream := httptest.NewServer(rec)
	defer upstream.Close()
	env := []string{
		"FENCEGATE_STORE=" + server.URL(),
		"FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}",
	}
	gate1 := start(t, t.TempDir(), env, "api", "gate")
	gate2 := start(t, t.TempDir(), env, "api", "gate")

	st, a, _ := call(t, "POST", gate1.url("api", "/v1/leases/job:9/acquire"), nil, `{"owner":"worker-a","ttl_seconds":1}`)
	if st != 200 {
		t.Fatalf("A acquire: %d %v", st, a)
	}
	tokA := strconv.FormatInt(token(t, a), 10)
	if st, _, _ := call(t, "PUT", gate1.url("gate", "/jobs/9"), map[string]string{"Fencing-Token": tokA}, `{"by":"a"}`); st != 200 {
		t.Fatalf("A's write through gate 1: %d", st)
	}
	time.Sleep(1200 * time.Millisecond)

	// B acquires through the other process's API: one store, one truth.
	st, b, _ := call(t, "POST", gate2.url("api", "/v1/leases/job:9/acquire"), nil, `{"owner":"worker-b","ttl_seconds":30}`)
	if st != 200 || token(t, b) <= token(t, a) {
		t.Fatalf("B acquire: %d %v", st, b)
	}
	tokB := strconv.FormatInt(token(t, b), 10)
	if st, _, _ := call(t, "PUT", gate2.url("gate", "/jobs/9"), map[string]string{"Fencing-Token": tokB}, `{"by":"b"}`); st != 200 {
		t.Fatalf("B's write through gate 2: %d", st)
	}
	st, refused, _ := call(t, "PUT", gate1.url("gate", "/jobs/9"), map[string]string{"Fencing-Token": tokA}, `{"by":"a","late":true}`)
	if st != http.StatusConflict || refused["code"] != "stale-token" {
		t.Fatalf("A's late write through gate 1: %d %v", st, refused)
	}
	if got := rec.list(); len(got) != 2 {
		t.Fatalf("upstream saw %d writes, want A's first and B's: %v", len(got), got)
	}

	// The store going away fails closed: 503 and nothing forwarded.
	server.Kill()
	st, down, hdr := call(t, "PUT", gate2.url("gate", "/jobs/9"), map[string]string{"Fencing-Token": tokB}, `{"by":"b","again":true}`)
	if st != http.StatusServiceUnavailable || down["code"] != "store-unavailable" || hdr.Get("Retry-After") == "" {
		t.Fatalf("write with the store down: %d %v", st, down)
	}
	if st, _, _ := call(t, "GET", gate2.url("api", "/readyz"), nil, ""); st != http.StatusServiceUnavailable {
		t.Fatalf("readyz with the store down: %d", st)
	}
	if got := rec.list(); len(got) != 2 {
		t.Fatalf("a write reached the upstream while the store was down: %v", got)
	}
}
