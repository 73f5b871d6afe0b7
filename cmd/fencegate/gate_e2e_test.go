package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// recorder is an upstream that records every write it receives.
type recorder struct {
	mu     sync.Mutex
	writes []string // "METHOD PATH token=T body=B"
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.writes = append(r.writes, req.Method+" "+req.URL.Path+" token="+req.Header.Get("Fencing-Token")+" body="+string(body))
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, `{"ok":true}`)
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.writes...)
}

// TestZombieWorkerIsFenced is the story fencegate exists for, through the
// real binary: A acquires and writes, A's lease expires while A is paused,
// B acquires and writes, and A's late write is refused and never reaches
// the upstream.
func TestZombieWorkerIsFenced(t *testing.T) {
	rec := &recorder{}
	upstream := httptest.NewServer(rec)
	defer upstream.Close()
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT,PATCH,DELETE /jobs/{id} fence job:{id}",
	}, "api", "gate")

	st, a, _ := call(t, "POST", p.url("api", "/v1/leases/job:7/acquire"), nil, `{"owner":"worker-a","ttl_seconds":1}`)
	if st != 200 {
		t.Fatalf("A acquire: %d %v", st, a)
	}
	tokA := strconv.FormatInt(token(t, a), 10)
	st, _, _ = call(t, "PUT", p.url("gate", "/jobs/7"), map[string]string{"Fencing-Token": tokA}, `{"by":"a","step":1}`)
	if st != 200 {
		t.Fatalf("A's first write: %d", st)
	}

	time.Sleep(1200 * time.Millisecond) // A pauses past its TTL

	st, b, _ := call(t, "POST", p.url("api", "/v1/leases/job:7/acquire"), nil, `{"owner":"worker-b","ttl_seconds":30}`)
	if st != 200 || token(t, b) <= token(t, a) {
		t.Fatalf("B acquire: %d %v", st, b)
	}
	tokB := strconv.FormatInt(token(t, b), 10)
	st, _, _ = call(t, "PUT", p.url("gate", "/jobs/7"), map[string]string{"Fencing-Token": tokB}, `{"by":"b"}`)
	if st != 200 {
		t.Fatalf("B's write: %d", st)
	}

	st, refused, hdr := call(t, "PUT", p.url("gate", "/jobs/7"), map[string]string{"Fencing-Token": tokA}, `{"by":"a","step":2}`)
	if st != http.StatusConflict || refused["code"] != "stale-token" || hdr.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("A's late write: %d %v (%s)", st, refused, hdr.Get("Content-Type"))
	}
	if hw, _ := refused["high_water_token"].(float64); strconv.FormatFloat(hw, 'f', -1, 64) != tokB {
		t.Fatalf("high_water_token %v, want %s", refused["high_water_token"], tokB)
	}

	want := []string{
		"PUT /jobs/7 token=" + tokA + ` body={"by":"a","step":1}`,
		"PUT /jobs/7 token=" + tokB + ` body={"by":"b"}`,
	}
	if got := rec.list(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("upstream saw:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Reads are not fenced.
	st, _, _ = call(t, "GET", p.url("gate", "/jobs/7"), nil, "")
	if st != 200 {
		t.Fatalf("read through the gate: %d", st)
	}
	if err := p.stop(); err != nil {
		t.Fatalf("exit: %v", err)
	}
}

// TestSIGTERMDrains checks the shutdown contract: /readyz turns 503 while
// draining, then the process exits 0.
func TestSIGTERMDrains(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_DRAIN_DELAY=3s"}, "api")
	if st, _, _ := call(t, "GET", p.url("api", "/readyz"), nil, ""); st != 200 {
		t.Fatalf("readyz before SIGTERM: %d", st)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		resp, err := http.Get(p.url("api", "/readyz"))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz never answered 503 while draining (last: %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.wait(20 * time.Second); err != nil {
		t.Fatalf("exit after drain: %v\n%s", err, p.logs)
	}
	if !strings.Contains(p.logs.String(), "forgotten when fencegate stops") {
		t.Errorf("the memory store did not warn that it forgets:\n%s", p.logs)
	}
	if !strings.Contains(p.logs.String(), "write gate off") {
		t.Errorf("no log line says the gate is off without FENCEGATE_UPSTREAM:\n%s", p.logs)
	}
}

// TestSIGTERMAnswersWaitingAcquisitions: an acquisition waiting for a
// held lease (wait_seconds) when the listeners shut down is answered 503
// draining at once, not left to hold the drain for the whole shutdown
// grace and then find its connection cut. It is sent during the drain
// delay, while the API still serves; one that arrived only after the
// waits ended is answered at once (lease-held), as without a wait.
func TestSIGTERMAnswersWaitingAcquisitions(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_DRAIN_DELAY=2s", "FENCEGATE_SHUTDOWN_GRACE=20s"}, "api")
	if st, _, _ := call(t, "POST", p.url("api", "/v1/leases/r/acquire"), nil, `{"owner":"holder","ttl_seconds":60}`); st != http.StatusOK {
		t.Fatalf("the holder's acquire: %d", st)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, `"msg":"draining"`)
	st, problem, _ := call(t, "POST", p.url("api", "/v1/leases/r/acquire"), nil, `{"owner":"waiter","wait_seconds":30}`)
	if !(st == http.StatusServiceUnavailable && problem["code"] == "draining") && !(st == http.StatusConflict && problem["code"] == "lease-held") {
		t.Errorf("the waiting acquisition: %d %v, want 503 draining", st, problem)
	}
	if err := p.wait(30 * time.Second); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.logs)
	}
	if strings.Contains(p.logs.String(), "cut off") && !strings.Contains(p.logs.String(), `"requests_cut_off":false`) {
		t.Errorf("the stop waited out its grace for the waiting acquisition:\n%s", p.logs)
	}
}

// TestSIGTERMWithSlowWrites: a write in flight when SIGTERM arrives is
// finished within the shutdown grace; one that outlasts the grace is cut
// off and logged. Either way the process exits 0.
func TestSIGTERMWithSlowWrites(t *testing.T) {
	for _, tc := range []struct {
		name       string
		grace      string
		wantStatus int // 0: the connection is cut off
	}{
		{"finishes within the grace", "10s", http.StatusOK},
		{"cut off after the grace", "300ms", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived := make(chan struct{}, 1)
			release := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
				w.WriteHeader(http.StatusOK)
			}))
			defer upstream.Close()
			defer close(release)
			p := start(t, t.TempDir(), []string{
				"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + upstream.URL, "FENCEGATE_SHUTDOWN_GRACE=" + tc.grace,
			}, "api", "gate")
			st, lease, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"a"}`)
			if st != 200 {
				t.Fatalf("acquire: %d", st)
			}
			tok := strconv.FormatInt(token(t, lease), 10) // token may t.Fatal: not in the goroutine
			got := make(chan int, 1)
			go func() {
				req, _ := http.NewRequest("PUT", p.url("gate", "/jobs/1"), strings.NewReader("x"))
				req.Header.Set("Fencing-Token", tok)
				req.Header.Set("Fencing-Resource", "job:1")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					got <- 0
					return
				}
				resp.Body.Close()
				got <- resp.StatusCode
			}()
			<-arrived
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if tc.wantStatus != 0 {
				time.Sleep(200 * time.Millisecond) // let the drain begin; the write must still finish
				release <- struct{}{}
			}
			if status := <-got; status != tc.wantStatus {
				t.Fatalf("in-flight write ended with %d, want %d", status, tc.wantStatus)
			}
			if err := p.wait(20 * time.Second); err != nil {
				t.Fatalf("exit: %v\n%s", err, p.logs)
			}
			if cut := strings.Contains(p.logs.String(), "cut off"); cut != (tc.wantStatus == 0) {
				t.Fatalf("cut-off logged = %v, want %v:\n%s", cut, tc.wantStatus == 0, p.logs)
			}
			// The cut-off write itself is listed, with its resource and token.
			listed := strings.Contains(p.logs.String(), `"msg":"write cut off at shutdown"`) &&
				strings.Contains(p.logs.String(), `"resource":"job:1","token":`+tok)
			if listed != (tc.wantStatus == 0) {
				t.Fatalf("cut-off write listed = %v, want %v:\n%s", listed, tc.wantStatus == 0, p.logs)
			}
			// One line per write: a cut-off write's warning is its only line.
			if n := strings.Count(p.logs.String(), `"resource":"job:1","token":`+tok); n != 1 {
				t.Fatalf("the write has %d log lines, want 1:\n%s", n, p.logs)
			}
			if tc.wantStatus != 0 && !strings.Contains(p.logs.String(), `"msg":"gate write","request_id"`) {
				t.Fatalf("no audit line for the finished write:\n%s", p.logs)
			}
		})
	}
}
