package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
	t    *testing.T
	cmd  *exec.Cmd
	addr map[string]string // listener name -> address
	logs *syncBuffer
	done chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, addr: map[string]string{}, logs: &syncBuffer{}, done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		signalled := false
		var mu sync.Mutex
		for sc.Scan() {
			line := sc.Text()
			p.logs.Write([]byte(line + "\n"))
			var rec struct {
				Msg, Listener, Addr string
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
				mu.Lock()
				p.addr[rec.Listener] = rec.Addr
				all := true
				for _, l := range listeners {
					if p.addr[l] == "" {
						all = false
					}
				}
				mu.Unlock()
				if all && !signalled {
					signalled = true
					close(ready)
				}
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	select {
	case <-ready:
	case err := <-p.done:
		t.Fatalf("fencegate exited before listening: %v\n%s", err, p.logs)
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
	select {
	case err := <-p.done:
		return err
	case <-time.After(30 * time.Second):
		p.t.Fatalf("fencegate did not exit after SIGTERM\n%s", p.logs)
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

func TestBadConfigurationFailsToStartNamingTheVariable(t *testing.T) {
	cmd := exec.Command(binary)
	cmd.Env = []string{"FENCEGATE_DEFAULT_TTL=forever"}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "FENCEGATE_DEFAULT_TTL") {
		t.Fatalf("bad config: err %v, output %q", err, out)
	}
}

// TestDefaultStoreKeepsTokensAcrossRestart is the README's first run: the
// default file store in the working directory, stopped and started again.
func TestDefaultStoreKeepsTokensAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	var env []string
	first := start(t, dir, env, "api")
	st, lease, _ := call(t, "POST", first.url("api", "/v1/leases/job:42/acquire"), nil, `{"owner":"worker-a","ttl_seconds":5}`)
	if st != 200 || token(t, lease) != 1 {
		t.Fatalf("acquire: %d %v", st, lease)
	}
	st, rel, _ := call(t, "POST", first.url("api", "/v1/leases/job:42/release"), nil, `{"owner":"worker-a","token":1}`)
	if st != 200 || rel["released"] != true {
		t.Fatalf("release: %d %v", st, rel)
	}
	st, lease, _ = call(t, "POST", first.url("api", "/v1/leases/job:42/acquire"), nil, `{"owner":"worker-b","ttl_seconds":60}`)
	if st != 200 || token(t, lease) != 2 {
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
	st, _, _ = call(t, "POST", second.url("api", "/v1/leases/job:42/release"), nil, `{"owner":"worker-b","token":2}`)
	if st != 200 {
		t.Fatalf("release after restart: %d", st)
	}
	st, lease, _ = call(t, "POST", second.url("api", "/v1/leases/job:42/acquire"), nil, `{"owner":"worker-c"}`)
	if st != 200 || token(t, lease) <= 2 {
		t.Fatalf("a new owner after restart got %d %v; want a token above every token issued before", st, lease)
	}
	if err := second.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}
