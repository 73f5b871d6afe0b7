package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/freeport"
	"github.com/fencegate/fencegate/internal/syncbuf"
	"github.com/fencegate/fencegate/internal/tiedproc"
)

// startNginx runs nginx as a WebDAV server (PUT, DELETE, COPY, MOVE under
// /files/) on a free loopback port with a temporary root, and returns its
// base URL and the directory it serves. It skips the test when nginx is
// not installed, unless FENCEGATE_REQUIRE_NGINX=1.
func startNginx(t *testing.T) (string, string) {
	t.Helper()
	if os.Getenv("FENCEGATE_QUICK") == "1" {
		t.Skip("FENCEGATE_QUICK=1 (scripts/test.sh --quick) skips tests that need a server")
	}
	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin = "/usr/sbin/nginx" // Debian's, often outside a user's PATH
		if _, serr := os.Stat(bin); serr != nil {
			if os.Getenv("FENCEGATE_REQUIRE_NGINX") == "1" {
				t.Fatal("nginx not found and FENCEGATE_REQUIRE_NGINX=1")
			}
			t.Skip("nginx not installed (set FENCEGATE_REQUIRE_NGINX=1 to make this a failure)")
		}
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "files"), 0o777); err != nil {
		t.Fatal(err)
	}
	// Workers run as nobody when nginx starts as root: run them as root
	// instead, so they can write to the test's temporary root.
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;"
	}
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`%s
daemon off;
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log info;
events { worker_connections 64; }
http {
	access_log off;
	client_body_temp_path %[2]s/body;
	server {
		listen %[3]s;
		root %[4]s;
		location /files/ {
			dav_methods PUT DELETE COPY MOVE;
			dav_access user:rw;
		}
	}
}
`, user, dir, addr, root)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", confPath, "-e", filepath.Join(dir, "error.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := tiedproc.Start(cmd, syscall.SIGTERM); err != nil { // nginx's fast shutdown
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // nginx's fast shutdown
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // its own process group
			<-exited
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %s\n%s", out, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx did not listen on %s: %s", addr, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "http://" + addr, root
}

// send sends method url with headers (name, value pairs) and body, and
// returns the status, the body, and the problem code if the answer is a
// problem.
func send(t *testing.T, method, url, body string, hdr ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var p struct{ Code string }
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		_ = json.Unmarshal(b, &p)
	}
	return resp.StatusCode, string(b), p.Code
}

// TestWebDAVDestinationIsFenced plays the stale-holder story against a real
// nginx WebDAV server behind the binary: the successor (token 2) wrote X;
// the stale holder (token 1 on X) takes a fresh lease on X-scratch, writes
// there, and tries to COPY, then MOVE, X-scratch onto X, then to PUT X
// through encoded traversal past a pass rule. All are refused and X keeps
// the successor's content. A COPY and a MOVE between two files
// whose leases the writer does hold go through, so nginx does honour
// Destination behind the gate.
func TestWebDAVDestinationIsFenced(t *testing.T) {
	dav, root := startNginx(t)
	// The memory store counts from one in every resource (the file store's
	// tokens follow the clock): the story below needs equal tokens on two
	// resources.
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:",
		"FENCEGATE_UPSTREAM=" + dav,
		"FENCEGATE_RULES=PUT,DELETE,COPY,MOVE /files/{name} fence file:{name}; PUT /public/{rest...} pass",
	}, "api", "gate")
	acquire := func(res, owner string, ttl int) string {
		t.Helper()
		st, l, _ := call(t, "POST", p.url("api", "/v1/leases/"+res+"/acquire"), nil, fmt.Sprintf(`{"owner":%q,"ttl_seconds":%d}`, owner, ttl))
		if st != 200 {
			t.Fatalf("acquire %s as %s: %d %v", res, owner, st, l)
		}
		return strconv.FormatInt(token(t, l), 10)
	}
	file := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, "files", name))
		if err != nil {
			return "(" + err.Error() + ")"
		}
		return string(b)
	}
	gate := func(path string) string { return p.url("gate", path) }

	stale := acquire("file:X", "stale", 1)
	time.Sleep(1200 * time.Millisecond) // the stale holder pauses past its TTL
	succ := acquire("file:X", "successor", 30)
	if st, b, _ := send(t, "PUT", gate("/files/X"), "successor's", "Fencing-Token", succ); st != 201 && st != 204 {
		t.Fatalf("successor's PUT: %d %s", st, b)
	}
	scratch := acquire("file:X-scratch", "stale", 30)
	if st, b, _ := send(t, "PUT", gate("/files/X-scratch"), "stale's", "Fencing-Token", scratch); st != 201 && st != 204 {
		t.Fatalf("stale holder's PUT on its scratch file: %d %s", st, b)
	}
	// The source's token alone is never judged on another resource.
	if st, b, code := send(t, "COPY", gate("/files/X-scratch"), "", "Fencing-Token", scratch, "Destination", "/files/X"); st != http.StatusPreconditionRequired || code != "token-required" {
		t.Errorf("COPY onto X without X's token: %d %s, want 428 token-required", st, b)
	}
	for _, method := range []string{"COPY", "MOVE"} {
		for _, dest := range []string{"/files/X", "http://" + p.addr["gate"] + "/files/X"} {
			// With its old token for X: refused there, as X's successor wrote.
			st, b, code := send(t, method, gate("/files/X-scratch"), "", "Fencing-Token", scratch, "Destination", dest, "Fencing-Destination-Token", stale)
			if st != http.StatusConflict || code != "stale-token" {
				t.Errorf("stale %s onto X (Destination %s): %d %s, want 409 stale-token", method, dest, st, b)
			}
			if got := file("X"); got != "successor's" {
				t.Fatalf("after the stale %s, X holds %q", method, got)
			}
		}
	}
	if got := file("X-scratch"); got != "stale's" {
		t.Fatalf("X-scratch holds %q after refused MOVEs", got)
	}
	// nginx decodes %2F and resolves "..": past a pass rule, these would
	// land on /files/X unfenced.
	for _, path := range []string{"/public/..%2Ffiles%2FX", "/public/%2e%2e/files/X", "/public/../files/X"} {
		st, b, code := send(t, "PUT", gate(path), "stale's", "Fencing-Token", stale)
		if st != http.StatusBadRequest || code != "path-not-canonical" {
			t.Errorf("PUT %s: %d %s, want 400 path-not-canonical", path, st, b)
		}
		if got := file("X"); got != "successor's" {
			t.Fatalf("after PUT %s, X holds %q", path, got)
		}
	}

	// Positive control: a writer holding both A and B, with a token on each.
	a, b := acquire("file:A", "w", 30), acquire("file:B", "w", 30)
	if st, body, _ := send(t, "PUT", gate("/files/A"), "a's", "Fencing-Token", a); st != 201 && st != 204 {
		t.Fatalf("PUT A: %d %s", st, body)
	}
	if st, body, _ := send(t, "COPY", gate("/files/A"), "", "Fencing-Token", a, "Destination", "/files/B", "Fencing-Destination-Token", b); st != 201 && st != 204 {
		t.Fatalf("COPY A onto B: %d %s", st, body)
	}
	if got := file("B"); got != "a's" {
		t.Fatalf("after COPY, B holds %q", got)
	}
	if st, body, _ := send(t, "DELETE", gate("/files/B"), "", "Fencing-Token", b); st != 204 {
		t.Fatalf("DELETE B: %d %s", st, body)
	}
	if st, body, _ := send(t, "MOVE", gate("/files/A"), "", "Fencing-Token", a, "Destination", "/files/B", "Fencing-Destination-Token", b); st != 201 && st != 204 {
		t.Fatalf("MOVE A onto B: %d %s", st, body)
	}
	if got, gone := file("B"), file("A"); got != "a's" || !strings.Contains(gone, "no such file") {
		t.Fatalf("after MOVE, B holds %q and A %q", got, gone)
	}
}

// TestHeaderFallbackOffWithRules: with route rules and
// FENCEGATE_RESOURCE_HEADER unset, a write that misses every rule is
// refused, whatever Fencing-Resource it names: variants of a fenced path
// that upstream frameworks route to the same handler cannot be fenced on a
// resource of the client's choosing. Without rules, the header is on.
func TestHeaderFallbackOffWithRules(t *testing.T) {
	rec := &recorder{}
	upstream := httptest.NewServer(rec)
	defer upstream.Close()
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT,PATCH,DELETE /jobs/{id} fence job:{id}",
	}, "api", "gate")
	st, l, _ := call(t, "POST", p.url("api", "/v1/leases/scratch/acquire"), nil, `{"owner":"w"}`)
	if st != 200 {
		t.Fatalf("acquire: %d %v", st, l)
	}
	tok := strconv.FormatInt(token(t, l), 10)
	for _, c := range []struct{ method, path string }{
		{"put", "/jobs/1"}, {"PUT", "/jobs/1/"}, {"PUT", "/Jobs/1"}, {"POST", "/jobs/1"},
	} {
		st, b, code := send(t, c.method, p.url("gate", c.path), "x", "Fencing-Token", tok, "Fencing-Resource", "scratch")
		if st != http.StatusBadRequest || code != "resource-required" {
			t.Errorf("%s %s: %d %s, want 400 resource-required", c.method, c.path, st, b)
		}
	}
	if got := rec.list(); len(got) != 0 {
		t.Fatalf("upstream got %v", got)
	}

	q := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + upstream.URL}, "api", "gate")
	st, l, _ = call(t, "POST", q.url("api", "/v1/leases/scratch/acquire"), nil, `{"owner":"w"}`)
	if st != 200 {
		t.Fatalf("acquire: %d %v", st, l)
	}
	tok = strconv.FormatInt(token(t, l), 10)
	if st, b, _ := send(t, "PUT", q.url("gate", "/anything"), "x", "Fencing-Token", tok, "Fencing-Resource", "scratch"); st != 200 {
		t.Fatalf("without rules, the header names the resource: %d %s", st, b)
	}
}
