package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestValkeyLossWithServerClockBehind, through the binary: X is issued as
// by a node whose clock is a minute ahead, and written; the data is lost
// (FLUSHALL). The next holder's token is above X although the server clock
// is behind it, and X is refused before and after the new holder's write
// and after a third acquisition. Then the server is switched to an evicting
// policy at runtime: /readyz turns red and writes are refused with 503
// "not-done" until it is noeviction again.
func TestValkeyLossWithServerClockBehind(t *testing.T) {
	server := valkeytest.Start(t)
	rec := &recorder{}
	upstream := httptest.NewServer(rec)
	defer upstream.Close()
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=" + server.URL(),
		"FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}",
	}, "api", "gate")
	acquire := func(owner string) int64 {
		t.Helper()
		st, l, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"`+owner+`","ttl_seconds":600}`)
		if st != 200 {
			t.Fatalf("acquire %s: %d %v", owner, st, l)
		}
		return token(t, l)
	}
	release := func(owner string, tok int64) {
		t.Helper()
		if st, _, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/release"), nil, fmt.Sprintf(`{"owner":%q,"token":%d}`, owner, tok)); st != 200 {
			t.Fatalf("release %s: %d", owner, st)
		}
	}
	write := func(tok int64, by string) (int, map[string]any) {
		t.Helper()
		st, body, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": strconv.FormatInt(tok, 10)}, `{"by":"`+by+`"}`)
		return st, body
	}

	release("a", acquire("a"))
	// A node whose clock is a minute ahead would have counted from there.
	ahead := time.Now().Add(time.Minute).UnixMicro()
	server.MustDo("HSET", "fencegate:{job:1}", "issued", strconv.FormatInt(ahead, 10))
	x := acquire("x")
	if x <= ahead {
		t.Fatalf("X %d not ahead of the clock", x)
	}
	if st, _ := write(x, "x"); st != 200 {
		t.Fatalf("X's write: %d", st)
	}

	server.MustDo("FLUSHALL")

	// This gate saw the record before the loss: its first admission after
	// it notices (503 store-unavailable, the store lost data) and lifts
	// the record past X.
	if st, body := write(x, "x-late"); st != http.StatusServiceUnavailable || body["outcome"] != "not-done" {
		t.Fatalf("X right after the loss: %d %v", st, body)
	}
	t1 := acquire("t1")
	if t1 <= x {
		t.Fatalf("token after the loss %d, not above X %d", t1, x)
	}
	if st, body := write(x, "x-late"); st != http.StatusConflict || body["code"] != "stale-token" {
		t.Fatalf("X before the post-loss write: %d %v", st, body)
	}
	if st, _ := write(t1, "t1"); st != 200 {
		t.Fatalf("T1's write: %d", st)
	}
	release("t1", t1)
	t2 := acquire("t2")
	if st, body := write(x, "x-late"); st != http.StatusConflict || body["code"] != "stale-token" {
		t.Fatalf("X after a third acquisition: %d %v", st, body)
	}
	if got := rec.list(); len(got) != 2 {
		t.Fatalf("upstream saw %q, want X's and T1's writes only", got)
	}

	server.MustDo("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	waitReadyz(t, p, http.StatusServiceUnavailable)
	st, body := write(t2, "t2")
	if st != http.StatusServiceUnavailable || body["code"] != "store-unavailable" || body["outcome"] != "not-done" {
		t.Fatalf("write with an evicting server: %d %v", st, body)
	}
	server.MustDo("CONFIG", "SET", "maxmemory-policy", "noeviction")
	waitReadyz(t, p, http.StatusOK)
	if st, _ := write(t2, "t2"); st != 200 {
		t.Fatalf("T2's write after noeviction is back: %d", st)
	}
	if got := rec.list(); len(got) != 3 {
		t.Fatalf("upstream saw %q, want X's, T1's and T2's writes", got)
	}
}

// waitReadyz polls /readyz until it answers want (the store's policy is
// re-checked every few seconds).
func waitReadyz(t *testing.T, p *proc, want int) {
	t.Helper()
	for range 300 {
		if st, _, _ := call(t, "GET", p.url("api", "/readyz"), nil, ""); st == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("/readyz did not answer %d within 15 s\n%s", want, p.logs)
}
