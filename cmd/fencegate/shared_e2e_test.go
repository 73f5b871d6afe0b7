package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestSharedBarrierAcrossProcesses: two fencegate processes with
// FENCEGATE_BARRIER=shared on one Valkey-compatible server. A's write goes
// through gate 1 and the upstream holds it; B takes over and writes
// through gate 2, which must not forward B's write until A's has been
// answered. Then the store holds no entry, and gate 2's metrics show the
// wait.
func TestSharedBarrierAcrossProcesses(t *testing.T) {
	server := valkeytest.Start(t)
	var (
		mu    sync.Mutex
		order []string
	)
	hold := make(chan struct{})
	var release sync.Once
	releaseA := func() { release.Do(func() { close(hold) }) }
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		order = append(order, string(body))
		mu.Unlock()
		if string(body) == "a" {
			<-hold
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer upstream.Close()
	defer releaseA() // before the upstream closes, should the test stop early
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), order...)
	}
	env := []string{
		"FENCEGATE_STORE=" + server.URL(),
		"FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}",
		"FENCEGATE_BARRIER=shared",
	}
	gate1 := start(t, t.TempDir(), append(env, "FENCEGATE_GATE_ID=gate-1"), "api", "gate")
	gate2 := start(t, t.TempDir(), append(env, "FENCEGATE_GATE_ID=gate-2"), "api", "gate")

	st, a, _ := call(t, "POST", gate1.url("api", "/v1/leases/job:3/acquire"), nil, `{"owner":"worker-a","ttl_seconds":1}`)
	if st != 200 {
		t.Fatalf("A acquire: %d %v", st, a)
	}
	aDone := make(chan int, 1)
	go func() {
		st, _, _ := call(t, "PUT", gate1.url("gate", "/jobs/3"), map[string]string{"Fencing-Token": strconv.FormatInt(token(t, a), 10)}, "a")
		aDone <- st
	}()
	for len(seen()) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(1100 * time.Millisecond) // A's lease expires while its write is held
	st, b, _ := call(t, "POST", gate2.url("api", "/v1/leases/job:3/acquire"), nil, `{"owner":"worker-b","ttl_seconds":30}`)
	if st != 200 {
		t.Fatalf("B acquire: %d %v", st, b)
	}
	bDone := make(chan int, 1)
	go func() {
		st, _, _ := call(t, "PUT", gate2.url("gate", "/jobs/3"), map[string]string{"Fencing-Token": strconv.FormatInt(token(t, b), 10)}, "b")
		bDone <- st
	}()
	time.Sleep(300 * time.Millisecond)
	if got := seen(); len(got) != 1 {
		t.Fatalf("B's write reached the upstream while A's was in flight through the other gate: %v", got)
	}
	releaseA()
	if st := <-aDone; st != http.StatusNoContent {
		t.Fatalf("A's write: %d", st)
	}
	if st := <-bDone; st != http.StatusNoContent {
		t.Fatalf("B's write: %d", st)
	}
	if got := seen(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("upstream order %v, want [a b]", got)
	}
	for {
		n, err := server.Do("ZCARD", "fencegate:{job:3}:bar")
		if err != nil {
			t.Fatal(err)
		}
		if n == "0" {
			break
		}
		time.Sleep(10 * time.Millisecond) // removals are sent after the response
	}
	if v := sample(scrape(t, gate2), "fencegate_gate_shared_barrier_waits_total", `outcome="passed"`); v != 1 {
		t.Errorf("gate 2's shared barrier waits: %v, want 1", v)
	}
}
