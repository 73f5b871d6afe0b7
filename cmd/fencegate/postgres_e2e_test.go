package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// TestPostgresEndToEnd runs the binary on a throwaway PostgreSQL cluster:
// the README walkthrough, the zombie story through two fencegate processes
// sharing the database, a fast restart of PostgreSQL and of fencegate with
// tokens intact, and PostgreSQL killed mid-stream (fail closed, nothing
// forwarded without an admission).
func TestPostgresEndToEnd(t *testing.T) {
	pg := pgtest.Start(t)
	rec := &recorder{}
	upstream := httptest.NewServer(rec)
	defer upstream.Close()
	// The password comes from PGPASSWORD in fencegate's environment, not
	// the URL (the test process itself has none set).
	env := []string{
		"FENCEGATE_STORE=" + pg.URLNoPassword("postgres"),
		"PGPASSWORD=" + pgtest.Password,
		"FENCEGATE_PG_SCHEMA=e2e",
		"FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}",
	}
	gate1 := start(t, t.TempDir(), env, "api", "gate")
	gate2 := start(t, t.TempDir(), env, "api", "gate")
	if !strings.Contains(gate1.logs.String(), `"server_version"`) {
		t.Fatalf("start-up does not log the server version:\n%s", gate1.logs)
	}

	t.Run("Walkthrough", func(t *testing.T) {
		api := func(method, path, body string) (int, map[string]any) {
			st, m, _ := call(t, method, gate1.url("api", path), nil, body)
			return st, m
		}
		// Tokens follow the database's clock in µs.
		st, a := api("POST", "/v1/leases/job:42/acquire", `{"owner":"worker-a","ttl_seconds":30}`)
		ta := token(t, a)
		if st != 200 || ta < time.Now().Add(-time.Minute).UnixMicro() {
			t.Fatalf("acquire: %d %v", st, a)
		}
		withTok := func(body string) string {
			return strings.Replace(body, `"token":1`, `"token":`+strconv.FormatInt(ta, 10), 1)
		}
		if st, m := api("POST", "/v1/leases/job:42/acquire", `{"owner":"worker-b"}`); st != 409 || m["code"] != "lease-held" || m["holder"] != "worker-a" {
			t.Fatalf("second owner: %d %v", st, m)
		}
		if st, m := api("POST", "/v1/leases/job:42/renew", withTok(`{"owner":"worker-a","token":1}`)); st != 200 {
			t.Fatalf("renew: %d %v", st, m)
		}
		if st, m := api("PUT", "/v1/leases/job:42/checkpoint", withTok(`{"owner":"worker-a","token":1,"state":{"done":17}}`)); st != 200 {
			t.Fatalf("checkpoint: %d %v", st, m)
		}
		if st, m := api("GET", "/v1/leases?prefix=job:", ""); st != 200 || len(m["leases"].([]any)) != 1 {
			t.Fatalf("list: %d %v", st, m)
		}
		if st, m := api("POST", "/v1/leases/job:42/release", withTok(`{"owner":"worker-a","token":1}`)); st != 200 || m["released"] != true {
			t.Fatalf("release: %d %v", st, m)
		}
		if st, m := api("POST", "/v1/leases/job:42/release", withTok(`{"owner":"worker-a","token":1}`)); st != 200 || m["released"] != false {
			t.Fatalf("release again: %d %v", st, m)
		}
		// worker-b, through the other process, gets a newer token and the state.
		st, b, _ := call(t, "POST", gate2.url("api", "/v1/leases/job:42/acquire"), nil, `{"owner":"worker-b"}`)
		if st != 200 || token(t, b) <= ta {
			t.Fatalf("worker-b acquire: %d %v", st, b)
		}
		st, cp, _ := call(t, "GET", gate2.url("api", "/v1/leases/job:42/checkpoint"), nil, "")
		prev, _ := cp["previous"].(map[string]any)
		if st != 200 || fmt.Sprint(cp["state"]) != "map[done:17]" || prev["ended"] != "released" || prev["owner"] != "worker-a" {
			t.Fatalf("checkpoint for worker-b: %d %v", st, cp)
		}
	})

	var tokB string
	t.Run("ZombieAcrossTwoGates", func(t *testing.T) {
		st, a, _ := call(t, "POST", gate1.url("api", "/v1/leases/job:7/acquire"), nil, `{"owner":"worker-a","ttl_seconds":1}`)
		if st != 200 {
			t.Fatalf("A acquire: %d %v", st, a)
		}
		tokA := strconv.FormatInt(token(t, a), 10)
		if st, _, _ := call(t, "PUT", gate1.url("gate", "/jobs/7"), map[string]string{"Fencing-Token": tokA}, `{"by":"a"}`); st != 200 {
			t.Fatalf("A's write through gate 1: %d", st)
		}
		time.Sleep(1200 * time.Millisecond) // A pauses past its TTL (the database's clock)
		st, b, _ := call(t, "POST", gate2.url("api", "/v1/leases/job:7/acquire"), nil, `{"owner":"worker-b","ttl_seconds":60}`)
		if st != 200 || token(t, b) <= token(t, a) {
			t.Fatalf("B acquire: %d %v", st, b)
		}
		tokB = strconv.FormatInt(token(t, b), 10)
		if st, _, _ := call(t, "PUT", gate2.url("gate", "/jobs/7"), map[string]string{"Fencing-Token": tokB}, `{"by":"b"}`); st != 200 {
			t.Fatalf("B's write through gate 2: %d", st)
		}
		st, refused, _ := call(t, "PUT", gate1.url("gate", "/jobs/7"), map[string]string{"Fencing-Token": tokA}, `{"by":"a","late":true}`)
		if st != http.StatusConflict || refused["code"] != "stale-token" {
			t.Fatalf("A's late write through gate 1: %d %v", st, refused)
		}
		if got := rec.list(); len(got) != 2 || strings.Contains(strings.Join(got, "\n"), "late") {
			t.Fatalf("upstream saw %v, want A's first write and B's", got)
		}
	})
	if tokB == "" {
		t.FailNow()
	}

	t.Run("RestartPostgresAndFencegate", func(t *testing.T) {
		pg.Stop() // fast shutdown
		st, down, hdr := call(t, "PUT", gate2.url("gate", "/jobs/7"), map[string]string{"Fencing-Token": tokB}, `{"by":"b","down":true}`)
		if st != http.StatusServiceUnavailable || down["code"] != "store-unavailable" || hdr.Get("Retry-After") == "" {
			t.Fatalf("write with PostgreSQL stopped: %d %v", st, down)
		}
		if st, _, _ := call(t, "GET", gate2.url("api", "/readyz"), nil, ""); st != http.StatusServiceUnavailable {
			t.Fatalf("readyz with PostgreSQL stopped: %d", st)
		}
		if err := pg.Start(); err != nil {
			t.Fatal(err)
		}
		if err := gate1.stop(); err != nil {
			t.Fatalf("gate 1 exit: %v", err)
		}
		gate1 = start(t, t.TempDir(), env, "api", "gate")

		// gate 2 kept its pool: its first call after the restart finds its
		// connections closed and recovers on fresh ones.
		if st, _, _ := call(t, "PUT", gate2.url("gate", "/jobs/7"), map[string]string{"Fencing-Token": tokB}, `{"by":"b","after":"restart"}`); st != 200 {
			t.Fatalf("B's write after the restarts: %d", st)
		}
		st, status, _ := call(t, "GET", gate1.url("api", "/v1/leases/job:7"), nil, "")
		num := func(v any) string { f, _ := v.(float64); return strconv.FormatInt(int64(f), 10) }
		if st != 200 || num(status["issued_token"]) != tokB || num(status["high_water_token"]) != tokB || status["lease"] == nil {
			t.Fatalf("status after the restarts: %d %v", st, status)
		}
		st, held, _ := call(t, "POST", gate1.url("api", "/v1/leases/job:7/acquire"), nil, `{"owner":"worker-c"}`)
		if st != 409 || held["holder"] != "worker-b" {
			t.Fatalf("B's lease did not survive the restarts: %d %v", st, held)
		}
		if got := rec.list(); len(got) != 3 || strings.Contains(strings.Join(got, "\n"), "down") {
			t.Fatalf("upstream saw %v", got)
		}
	})

	t.Run("KilledMidStream", func(t *testing.T) {
		before := len(rec.list())
		var (
			mu        sync.Mutex
			forwarded []string // bodies answered 200
			refused   int
			stop      = make(chan struct{})
			wg        sync.WaitGroup
			bad       []string
		)
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					body := fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)
					req, _ := http.NewRequest("PUT", gate2.url("gate", "/jobs/7"), strings.NewReader(body))
					req.Header.Set("Fencing-Token", tokB)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						mu.Lock()
						bad = append(bad, err.Error())
						mu.Unlock()
						return
					}
					resp.Body.Close()
					mu.Lock()
					switch resp.StatusCode {
					case 200:
						forwarded = append(forwarded, body)
					case http.StatusServiceUnavailable:
						refused++
					default:
						bad = append(bad, fmt.Sprintf("%s: %d", body, resp.StatusCode))
					}
					mu.Unlock()
				}
			}()
		}
		waitFor := func(what string, cond func() bool) {
			deadline := time.Now().Add(10 * time.Second)
			for !cond() {
				if time.Now().After(deadline) {
					close(stop)
					wg.Wait()
					t.Fatalf("timed out waiting for %s", what)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		count := func() (int, int) { mu.Lock(); defer mu.Unlock(); return len(forwarded), refused }
		waitFor("writes to flow", func() bool { n, _ := count(); return n >= 50 })
		pg.Kill()
		waitFor("writes to fail closed", func() bool { _, r := count(); return r >= 50 })
		close(stop)
		wg.Wait()
		if len(bad) > 0 {
			t.Fatalf("answers other than 200 and 503: %v", bad)
		}
		// Nothing reached the upstream but the admitted writes: the
		// upstream's record is exactly the writes answered 200.
		var got []string
		for _, w := range rec.list()[before:] {
			got = append(got, w[strings.Index(w, "body=")+len("body="):])
		}
		slices.Sort(got)
		slices.Sort(forwarded)
		if !slices.Equal(got, forwarded) {
			t.Fatalf("upstream saw %d writes, fencegate answered 200 to %d", len(got), len(forwarded))
		}
		t.Logf("%d writes forwarded before the kill, %d refused with 503 after", len(forwarded), refused)
		if st, _, _ := call(t, "GET", gate2.url("api", "/readyz"), nil, ""); st != http.StatusServiceUnavailable {
			t.Fatalf("readyz with PostgreSQL killed: %d", st)
		}
	})
}
