package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// arrivals is an upstream that notes when each write arrived, by token,
// and can hold the writes whose body is "block" until released.
type arrivals struct {
	mu      sync.Mutex
	at      map[string][]time.Time
	arrived chan struct{} // one send per "block" write
	release chan struct{}
}

func newArrivals(t *testing.T) (*arrivals, *httptest.Server) {
	a := &arrivals{at: map[string][]time.Time{}, arrived: make(chan struct{}, 16), release: make(chan struct{})}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(a.release) }) // runs first: frees held handlers
	return a, srv
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	tok := r.Header.Get("Fencing-Token")
	a.mu.Lock()
	a.at[tok] = append(a.at[tok], now)
	a.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	if string(body) == "block" {
		a.arrived <- struct{}{}
		select {
		case <-a.release:
		case <-r.Context().Done():
		}
	}
	w.WriteHeader(http.StatusOK)
}

// first is when a write with tok first arrived, or the zero time.
func (a *arrivals) first(tok string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.at[tok]) == 0 {
		return time.Time{}
	}
	return a.at[tok][0]
}

func acquireToken(t *testing.T, p *proc, resource, owner string, ttl int) string {
	t.Helper()
	st, l, _ := call(t, "POST", p.url("api", "/v1/leases/"+resource+"/acquire"), nil,
		`{"owner":"`+owner+`","ttl_seconds":`+strconv.Itoa(ttl)+`}`)
	if st != 200 {
		t.Fatalf("acquire %s as %s: %d %v", resource, owner, st, l)
	}
	return strconv.FormatInt(token(t, l), 10)
}

// TestStalledBodyReleasesTheBarrier: through the binary, with every body
// streamed (FENCEGATE_BODY_BUFFER=0: a buffered body is read before
// admission, so it never holds the barrier), a client whose admitted
// write sends 4 of 100 body bytes and stalls is cut off at
// FENCEGATE_BODY_TIMEOUT; its resource stays held for
// FENCEGATE_TIMEOUT_GRACE (the upstream got part of it), then the
// successor's higher-token write, sent meanwhile, goes through. It never
// reaches the upstream before the hold could have ended.
func TestStalledBodyReleasesTheBarrier(t *testing.T) {
	const bodyTimeout, grace = time.Second, time.Second
	up, upSrv := newArrivals(t)
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + upSrv.URL,
		"FENCEGATE_BODY_TIMEOUT=" + bodyTimeout.String(), "FENCEGATE_TIMEOUT_GRACE=" + grace.String(),
		"FENCEGATE_BARRIER_TIMEOUT=30s", "FENCEGATE_BODY_BUFFER=0",
	}, "api", "gate")
	old := acquireToken(t, p, "job:1", "old", 1)
	time.Sleep(1100 * time.Millisecond) // the old lease expires
	successor := acquireToken(t, p, "job:1", "successor", 60)

	c, err := net.Dial("tcp", p.addr["gate"])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := time.Now()
	if _, err := io.WriteString(c, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Resource: job:1\r\nFencing-Token: "+old+
		"\r\nContent-Length: 100\r\n\r\nabcd"); err != nil {
		t.Fatal(err)
	}
	for { // admitted (registered at the barrier first): the high-water mark is its token
		_, status, _ := call(t, "GET", p.url("api", "/v1/leases/job:1"), nil, "")
		if hw, ok := status["high_water_token"].(float64); ok && strconv.FormatInt(int64(hw), 10) == old {
			break
		}
		time.Sleep(5 * time.Millisecond)
		if time.Since(sent) > 20*time.Second {
			t.Fatal("the stalled write was never admitted")
		}
	}
	st, body, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": successor, "Fencing-Resource": "job:1"}, `{"by":"successor"}`)
	if st != 200 {
		t.Fatalf("the successor's write: %d %v", st, body)
	}
	if at := up.first(successor); at.Before(sent.Add(bodyTimeout + grace)) {
		t.Fatalf("the successor's write reached the upstream %v after the stalled write was sent, before its body deadline (%v) plus grace (%v) ended",
			at.Sub(sent), bodyTimeout, grace)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(answer), "HTTP/1.1 408") || !strings.Contains(string(answer), "body-timeout") {
		t.Fatalf("the stalled client was answered %q", answer)
	}
}

// TestBarrierHoldsSurviveRestart: a write cut off at shutdown keeps its
// resource held after a restart, for the grace, and after a crash (SIGKILL)
// every resource is held for the grace: a higher token is not forwarded
// before the hold ends, even with a failed start in between.
func TestBarrierHoldsSurviveRestart(t *testing.T) {
	const grace = 3 * time.Second
	for _, crash := range []bool{false, true} {
		name := "cut off at shutdown"
		if crash {
			name = "crash"
		}
		t.Run(name, func(t *testing.T) {
			up, upSrv := newArrivals(t)
			dir := t.TempDir()
			env := []string{
				"FENCEGATE_UPSTREAM=" + upSrv.URL, "FENCEGATE_TIMEOUT_GRACE=" + grace.String(),
				"FENCEGATE_SHUTDOWN_GRACE=200ms", "FENCEGATE_BARRIER_TIMEOUT=30s",
			}
			p := start(t, dir, env, "api", "gate")
			old := acquireToken(t, p, "job:1", "old", 1)
			time.Sleep(1100 * time.Millisecond)
			successor := acquireToken(t, p, "job:1", "successor", 60)
			go func() {
				req, _ := http.NewRequest("PUT", p.url("gate", "/jobs/1"), strings.NewReader("block"))
				req.Header.Set("Fencing-Token", old)
				req.Header.Set("Fencing-Resource", "job:1")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			<-up.arrived
			stopped := time.Now()
			if crash {
				if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				if err := p.wait(20 * time.Second); err == nil || !errors.As(err, new(interface{ ExitCode() int })) {
					t.Fatalf("exit after SIGKILL: %v", err)
				}
			} else if err := p.stop(); err != nil {
				t.Fatalf("exit: %v\n%s", err, p.logs)
			}
			// A start that fails before serving (the gate's port in use)
			// leaves the record as it was: it does not replace the
			// crash's hold on every resource, nor the holds of the
			// clean stop, with a clean stop of its own.
			failStartOnBusyGatePort(t, dir, env)

			q := start(t, dir, env, "api", "gate")
			want := "barrier holds restored"
			if crash {
				want = "did not record a clean stop"
			}
			if !strings.Contains(q.logs.String(), want) {
				t.Errorf("the restart did not log %q:\n%s", want, q.logs)
			}
			st, body, _ := call(t, "PUT", q.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": successor, "Fencing-Resource": "job:1"}, `{"by":"successor"}`)
			if st != 200 {
				t.Fatalf("the successor's write: %d %v", st, body)
			}
			if at := up.first(successor); at.Before(stopped.Add(grace)) {
				t.Fatalf("the successor's write reached the upstream %v after the stop, within the grace (%v)", at.Sub(stopped), grace)
			}
			if err := q.stop(); err != nil {
				t.Fatalf("exit: %v", err)
			}
		})
	}
}

// failStartOnBusyGatePort runs serve in dir with env (its store must be
// the file store in dir: fg runs the binary elsewhere) and the gate's port
// taken by a listener of the test, and checks that it fails for that.
func failStartOnBusyGatePort(t *testing.T, dir string, env []string) {
	t.Helper()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	env = append([]string{"FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_PROXY_ADDR=" + busy.Addr().String(),
		"FENCEGATE_STORE=file:" + filepath.Join(dir, "fencegate.db")}, env...)
	r := fg(t, env, "", "serve")
	if r.code != exitFailure || !strings.Contains(r.stderr, "gate listener") || !strings.Contains(r.stderr, "address already in use") {
		t.Fatalf("serve with the gate's port in use: exit %d, want %d naming the gate's address in use\n%s", r.code, exitFailure, r.stderr)
	}
}

// TestFailedStartDoesNotHold: a start that fails before serving (the
// gate's port in use) after it opened the file store forwarded nothing,
// so the next start holds no resource: a valid holder's fenced write goes
// through at once. Were the failed start taken for a crash, every resource
// would be held for FENCEGATE_TIMEOUT_GRACE (30 s, the default, kept): the
// short barrier timeout makes that write answer 503 barrier-timeout after
// 1 s rather than wait out the hold.
func TestFailedStartDoesNotHold(t *testing.T) {
	up, upSrv := newArrivals(t)
	dir := t.TempDir()
	env := []string{"FENCEGATE_UPSTREAM=" + upSrv.URL, "FENCEGATE_BARRIER_TIMEOUT=1s"}
	failStartOnBusyGatePort(t, dir, env)

	p := start(t, dir, env, "api", "gate")
	if strings.Contains(p.logs.String(), "did not record a clean stop") {
		t.Errorf("the start after a failed one logged an unclean stop:\n%s", p.logs)
	}
	tok := acquireToken(t, p, "job:1", "worker", 60)
	st, body, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": tok, "Fencing-Resource": "job:1"}, `{"by":"worker"}`)
	if st != 200 || up.first(tok).IsZero() {
		t.Fatalf("the holder's write after a failed start: %d %v, want 200 forwarded", st, body)
	}
	if err := p.stop(); err != nil {
		t.Fatalf("exit: %v\n%s", err, p.logs)
	}
}
