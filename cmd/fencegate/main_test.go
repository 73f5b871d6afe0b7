package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/syncbuf"
	"github.com/fencegate/fencegate/internal/tiedproc"
)

// binary is the fencegate binary built once for the end-to-end tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencegate-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "fencegate")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building fencegate:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running fencegate binary.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	addr   map[string]string // listener name -> address; set once, before start returns
	logs   *syncbuf.Buffer
	exited chan struct{} // closed when the process has exited; err is then set
	err    error         // cmd.Wait's result
}

// start runs the binary in dir with env (plus listeners on free ports) and
// waits until every expected listener logged its address.
func start(t *testing.T, dir string, env []string, listeners ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, "serve")
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_PROXY_ADDR=127.0.0.1:0"}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tiedproc.Start(cmd, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, logs: &syncbuf.Buffer{}, exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		// The addresses are collected here and published once, before
		// ready is closed; later "listening" lines are not recorded.
		addrs := map[string]string{}
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.logs.Write([]byte(line + "\n"))
			var rec struct {
				Msg, Listener, Addr string
			}
			if p.addr != nil || json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "listening" {
				continue
			}
			addrs[rec.Listener] = rec.Addr
			if !slices.ContainsFunc(listeners, func(l string) bool { return addrs[l] == "" }) {
				p.addr = addrs
				close(ready)
			}
		}
		p.err = cmd.Wait() // after the last read from the pipe, as Wait requires
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("fencegate exited before listening: %v\n%s", p.err, p.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("fencegate did not start listening\n%s", p.logs)
	}
	return p
}

// stop sends SIGTERM and returns the exit error.
func (p *proc) stop() error {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	return p.wait(30 * time.Second)
}

// wait waits up to d for the process to exit and returns its exit error.
func (p *proc) wait(d time.Duration) error {
	p.t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(d):
		p.t.Fatalf("fencegate did not exit within %v\n%s", d, p.logs)
		return nil
	}
}

func (p *proc) url(listener, path string) string { return "http://" + p.addr[listener] + path }

// call sends a JSON request and decodes the JSON answer into a map.
func call(t *testing.T, method, url string, header map[string]string, body string) (int, map[string]any, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s %s: answer is not JSON: %q", method, url, raw)
		}
	}
	return resp.StatusCode, m, resp.Header
}

func token(t *testing.T, m map[string]any) int64 {
	t.Helper()
	v, ok := m["token"].(float64)
	if !ok {
		t.Fatalf("no token in %v", m)
	}
	return int64(v)
}

func TestVersionAndEnv(t *testing.T) {
	out, err := exec.Command(binary, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "fencegate ") {
		t.Fatalf("version: %q %v", out, err)
	}
	out, err = exec.Command(binary, "env").Output()
	if err != nil || !strings.Contains(string(out), "FENCEGATE_STORE") || !strings.Contains(string(out), "file:fencegate.db") {
		t.Fatalf("env: %q %v", out, err)
	}
	if err := exec.Command(binary, "bogus").Run(); err == nil {
		t.Fatal("an unknown command exited 0")
	}
}

// TestBadConfigurationFailsToStartNamingTheVariable: serve refuses a bad
// setting naming it, and exits 2, as check does for the same setting; a
// failure only starting finds (the API's port in use) exits 1, while check,
// which listens on nothing, accepts that configuration.
func TestBadConfigurationFailsToStartNamingTheVariable(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	// Were the bad value accepted, the process would serve: keep it off
	// the default ports and out of the package directory (fg runs it in a
	// temporary directory and bounds its run).
	base := []string{"FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_PROXY_ADDR=127.0.0.1:0", "FENCEGATE_STORE=memory:"}
	for _, tc := range []struct {
		env  []string
		want []string
	}{
		{[]string{"FENCEGATE_DEFAULT_TTL=forever"}, []string{"FENCEGATE_DEFAULT_TTL"}},
		{[]string{"FENCEGATE_STOR=memory:"}, []string{"FENCEGATE_STOR", "did you mean FENCEGATE_STORE"}},
		{[]string{"FENCEGATE_UPSTREAM=http://127.0.0.1:1", "FENCEGATE_RULES=PUT /x/{id} fence job/{id}"}, []string{"FENCEGATE_RULES", "line 1"}},
		{[]string{"FENCEGATE_UPSTREAM=http://127.0.0.1:1", "FENCEGATE_RULES_FILE=" + missing}, []string{"FENCEGATE_RULES_FILE"}},
		{[]string{"FENCEGATE_VALKEY_CA_FILE=" + missing}, []string{"FENCEGATE_VALKEY_CA_FILE"}},
		{[]string{"FENCEGATE_ACCESS_FILE=" + missing}, []string{"FENCEGATE_ACCESS_FILE"}},
		{[]string{"FENCEGATE_API_TOKEN="}, []string{"FENCEGATE_API_TOKEN is set but empty"}},
		{[]string{"FENCEGATE_STORE="}, []string{"FENCEGATE_STORE is set but empty"}},
	} {
		env := append(slices.Clone(base), tc.env...)
		for _, cmd := range []string{"check", "serve"} {
			r := fg(t, env, "", cmd)
			if r.code != exitUsage {
				t.Errorf("%s %v: exit %d, want %d (a bad configuration)\n%s%s", cmd, tc.env, r.code, exitUsage, r.stdout, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("%s %v: stderr %q does not say %q", cmd, tc.env, r.stderr, w)
				}
			}
		}
	}

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	env := []string{"FENCEGATE_API_ADDR=" + busy.Addr().String(), "FENCEGATE_PROXY_ADDR=127.0.0.1:0", "FENCEGATE_STORE=memory:"}
	if r := fg(t, env, "", "check"); r.code != exitOK {
		t.Errorf("check with the API's port in use: exit %d, want %d (the configuration is valid)\n%s%s", r.code, exitOK, r.stdout, r.stderr)
	}
	r := fg(t, env, "", "serve")
	if r.code != exitFailure || !strings.Contains(r.stderr, "address already in use") {
		t.Errorf("serve with the API's port in use: exit %d, want %d naming the address in use\n%s", r.code, exitFailure, r.stderr)
	}
}

// TestDefaultStoreKeepsTokensAcrossRestart is the README's first run: the
// default file store in the working directory, stopped and started again.
func TestDefaultStoreKeepsTokensAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	var env []string
	first := start(t, dir, env, "api")
	st, lease, _ := call(t, "POST", first.url("api", "/v1/leases/job:42/acquire"), nil, `{"owner":"worker-a","ttl_seconds":5}`)
	if st != 200 {
		t.Fatalf("acquire: %d %v", st, lease)
	}
	// A new store file starts its tokens at the host clock in µs, so that
	// they stay above those of a file it may replace.
	t1 := token(t, lease)
	if now := time.Now().UnixMicro(); t1 <= 1 || t1 > now {
		t.Fatalf("first token %d, want from the clock floor (now %d µs)", t1, now)
	}
	st, rel, _ := call(t, "POST", first.url("api", "/v1/leases/job:42/release"), nil, fmt.Sprintf(`{"owner":"worker-a","token":%d}`, t1))
	if st != 200 || rel["released"] != true {
		t.Fatalf("release: %d %v", st, rel)
	}
	st, lease, _ = call(t, "POST", first.url("api", "/v1/leases/job:42/acquire"), nil, `{"owner":"worker-b","ttl_seconds":60}`)
	// Tokens follow the clock: above the last, at the clock or past it.
	t2 := token(t, lease)
	if st != 200 || t2 <= t1 {
		t.Fatalf("second acquire: %d %v", st, lease)
	}
	if err := first.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, first.logs)
	}
	if _, err := os.Stat(filepath.Join(dir, "fencegate.db")); err != nil {
		t.Fatalf("the default store did not create fencegate.db: %v", err)
	}

	second := start(t, dir, env, "api")
	// worker-b's lease is still live after the restart: expiry is a wall-clock instant.
	st, held, _ := call(t, "POST", second.url("api", "/v1/leases/job:42/acquire"), nil, `{"owner":"worker-c"}`)
	if st != 409 || held["code"] != "lease-held" || held["holder"] != "worker-b" {
		t.Fatalf("acquire of a live lease after restart: %d %v", st, held)
	}
	st, _, _ = call(t, "POST", second.url("api", "/v1/leases/job:42/release"), nil, fmt.Sprintf(`{"owner":"worker-b","token":%d}`, t2))
	if st != 200 {
		t.Fatalf("release after restart: %d", st)
	}
	st, lease, _ = call(t, "POST", second.url("api", "/v1/leases/job:42/acquire"), nil, `{"owner":"worker-c"}`)
	if st != 200 || token(t, lease) <= t2 {
		t.Fatalf("a new owner after restart got %d %v; want a token above every token issued before", st, lease)
	}
	if err := second.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err   error
		code  int
		print bool
	}{
		{nil, exitOK, false},
		{errors.New("boom"), exitFailure, true},
		{withExit(exitUsage, errors.New("bad flag")), exitUsage, true},
		{fmt.Errorf("wrapped: %w", withExit(exitRefused, errors.New("lease-held"))), exitRefused, true},
		{withExit(exitLeaseLost, nil), exitLeaseLost, false},
	} {
		code, print := exitCode(tc.err)
		if code != tc.code || print != tc.print {
			t.Errorf("exitCode(%v) = %d, %v; want %d, %v", tc.err, code, print, tc.code, tc.print)
		}
	}
}

// exchange writes raw on c and reads one answer.
func exchange(t *testing.T, c net.Conn, raw string) (int, string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: no answer: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}
