//go:build unix

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/certs/certstest"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// replaceFile puts text in file's place whole, by a rename, as docs/gate.md
// asks of a rules file.
func replaceFile(t *testing.T, file, text string) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

// sighup sends p the reload signal.
func sighup(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

// TestReloadRefusesAFIFOAndStillStops: FENCEGATE_RULES_FILE replaced by a
// FIFO with no writer, then by a link to /dev/zero: each SIGHUP's reload
// is refused at once, naming the file and what it is, and the rules in
// force stay; a good file is taken at the next SIGHUP; with a FIFO back in
// place and reloaded, SIGTERM drains and the process exits 0 (DESIGN §7,
// §11). Before, the reload blocked for ever reading the FIFO: no reload
// ran after it, and the process logged "stopped" but never exited, its
// reload loop's stop waiting for the blocked read.
func TestReloadRefusesAFIFOAndStillStops(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "rules")
	replaceFile(t, file, "PUT /jobs/{id} fence job:{id}\nPUT /open/{id} pass\n")
	p := start(t, dir, []string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + srv.URL,
		"FENCEGATE_RULES_FILE=" + file, "FENCEGATE_DRAIN_DELAY=0s", "FENCEGATE_SHUTDOWN_GRACE=1s"}, "api", "gate")
	// openPut is the status of an unfenced PUT /open/1: 200 under the
	// first rules (pass), 428 under the second (no rule for it).
	openPut := func() int {
		t.Helper()
		st, _, _ := call(t, http.MethodPut, p.url("gate", "/open/1"), nil, "")
		return st
	}
	fifo := func() {
		t.Helper()
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(file, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	refused := `"msg":"reload refused: the configuration in force stays","what":"FENCEGATE_RULES_FILE ` + file + `","error":"FENCEGATE_RULES_FILE: ` + file

	fifo()
	sighup(t, p)
	p.waitLog(refused+` is a FIFO (named pipe), not a regular file"`, 1)
	if st := openPut(); st != http.StatusOK {
		t.Errorf("after the refused FIFO, PUT /open/1: %d, want 200 (the rules in force stay)", st)
	}

	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", file); err != nil {
		t.Fatal(err)
	}
	sighup(t, p)
	p.waitLog(refused+` is a character device, not a regular file"`, 1)

	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	replaceFile(t, file, "PUT /jobs/{id} fence job:{id}\n")
	sighup(t, p)
	p.waitLog(`"msg":"write gate rules reloaded"`, 1)
	if st := openPut(); st != http.StatusPreconditionRequired {
		t.Errorf("after the good file, PUT /open/1: %d, want 428 (the new rules)", st)
	}

	fifo()
	sighup(t, p)
	p.waitLog(refused+` is a FIFO (named pipe), not a regular file"`, 2)
	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.logs)
	}
	if l := p.logs.String(); !strings.Contains(l, `"msg":"stopped"`) || strings.Contains(l, "a reload is still running") {
		t.Errorf("the stop did not drain, or found a reload left running:\n%s", l)
	}
}

// TestStartRefusesAFIFOConfigFile: check and serve refuse, at once and
// exit 2 naming the variable, a FIFO given as a file that reloads re-read
// (the rules, the access file, a TLS certificate), as a reload does; they
// no longer wait for a writer for ever.
func TestStartRefusesAFIFOConfigFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	set := certstest.New(t)
	base := []string{"FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_PROXY_ADDR=127.0.0.1:0", "FENCEGATE_STORE=memory:"}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"FENCEGATE_UPSTREAM=http://127.0.0.1:1", "FENCEGATE_RULES_FILE=" + fifo}, "FENCEGATE_RULES_FILE"},
		{[]string{"FENCEGATE_ACCESS_FILE=" + fifo}, "FENCEGATE_ACCESS_FILE"},
		{[]string{"FENCEGATE_API_TLS_CERT=" + fifo, "FENCEGATE_API_TLS_KEY=" + set.ServerKey}, "FENCEGATE_API_TLS_CERT"},
		{[]string{"FENCEGATE_API_TLS_CERT=" + set.ServerCert, "FENCEGATE_API_TLS_KEY=" + set.ServerKey, "FENCEGATE_API_TLS_CLIENT_CA=" + fifo}, "FENCEGATE_API_TLS_CLIENT_CA"},
	} {
		env := append(slices.Clone(base), tc.env...)
		for _, cmd := range []string{"check", "serve"} {
			r := fg(t, env, "", cmd)
			if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, fifo+" is a FIFO (named pipe), not a regular file") {
				t.Errorf("%s with %v: exit %d, want %d naming %s and the FIFO\n%s%s", cmd, tc.env, r.code, exitUsage, tc.want, r.stdout, r.stderr)
			}
		}
	}
}

// TestAccessReloadOpenConnectionsAndWaiters: pool-a's prefix shrinks, then
// pool-a is removed, by rename + SIGHUP, while pool-a holds an HTTP/1.1
// keep-alive connection and an HTTP/2 connection and has an acquisition
// waiting (wait_seconds) on a resource the admin holds. Its next call on
// either open connection is judged by the new file; the waiting
// acquisition is judged again when the admin lets go: 403 forbidden once
// the resource is outside its prefix, 401 unauthorized once pool-a is
// gone, and no lease is taken for it. Before, the waiter kept the
// permission it was checked with and got the lease.
func TestAccessReloadOpenConnectionsAndWaiters(t *testing.T) {
	s := newAccessSetup(t)
	mk := func(h2 bool) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.set.CA.Pool(), Certificates: []tls.Certificate{s.set.Client.TLS(t)}}, ForceAttemptHTTP2: h2, MaxIdleConnsPerHost: 1}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	c1, c2, c3 := mk(false), mk(true), mk(false)
	type res struct {
		st     int
		proto  string
		reused bool
		body   string
	}
	// send runs outside the test's goroutine too: no t.Fatal.
	send := func(c *http.Client, method, path, body string) res {
		var reused bool
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		req, _ := http.NewRequestWithContext(ctx, method, s.api+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok-a")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := c.Do(req)
		if err != nil {
			return res{body: err.Error()}
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return res{resp.StatusCode, resp.Proto, reused, string(b)}
	}
	// heldTries is how many acquisitions the store has refused as held:
	// here only pool-a's waiting ones, each once it passed its first check
	// and asked the store.
	heldTries := func() float64 {
		t.Helper()
		resp, err := c1.Get(s.api + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return max(sample(string(b), "fencegate_store_duration_seconds_count", `operation="acquire"`, `outcome="lease-held"`), 0)
	}
	// wait has the admin take res and pool-a wait for it; it returns the
	// admin's release body and pool-a's answer to come.
	wait := func(resource string) (string, chan res) {
		t.Helper()
		st, m, raw := s.do(t, "tok-admin", "POST", "/v1/leases/"+resource+"/acquire", `{"owner":"adm","ttl_seconds":60}`)
		if st != 200 {
			t.Fatalf("admin acquire %s: %d %s", resource, st, raw)
		}
		tries := heldTries()
		out := make(chan res, 1)
		go func() {
			out <- send(c3, "POST", "/v1/leases/"+resource+"/acquire", `{"owner":"pool-a/w","ttl_seconds":60,"wait_seconds":20}`)
		}()
		for deadline := time.After(30 * time.Second); heldTries() <= tries; {
			select {
			case r := <-out:
				t.Fatalf("pool-a's acquisition of %s answered before it waited: %+v", resource, r)
			case <-deadline:
				t.Fatalf("pool-a's acquisition of %s never asked the store", resource)
			case <-time.After(10 * time.Millisecond):
			}
		}
		return fmt.Sprintf(`{"owner":"adm","token":%d}`, token(t, m)), out
	}
	rewrite := func(doc string) {
		t.Helper()
		replaceFile(t, s.file, doc)
		sighup(t, s.p)
	}
	// refusedWait has the admin release resource (body rel), then checks
	// pool-a's waiting acquisition of it answers status and code, and that
	// the resource is free, its last lease the admin's: none was taken for
	// pool-a.
	refusedWait := func(resource, rel string, waited chan res, status int, code, why string) {
		t.Helper()
		if st, _, raw := s.do(t, "tok-admin", "POST", "/v1/leases/"+resource+"/release", rel); st != 200 {
			t.Fatalf("admin release: %d %s", st, raw)
		}
		if w := <-waited; w.st != status || !strings.Contains(w.body, `"`+code+`"`) {
			t.Errorf("pool-a's acquisition of %s, waiting when a reload %s: %d %s, want %d %s", resource, why, w.st, w.body, status, code)
		}
		st := s.status(t, resource)
		prev, _ := st["previous"].(map[string]any)
		if st["lease"] != nil || prev == nil || prev["owner"] == "pool-a/w" {
			t.Errorf("%s after pool-a's refused wait: %v, want it free, no lease of pool-a's", resource, st)
		}
	}
	reloaded := `"msg":"reloaded","what":"FENCEGATE_ACCESS_FILE ` + s.file

	for _, c := range []*http.Client{c1, c2} {
		if r := send(c, "GET", "/v1/leases/job:a:1", ""); r.st != 200 {
			t.Fatalf("warm-up: %+v", r)
		}
	}
	rel, waited := wait("job:a:w")
	shrunk := strings.Replace(accessFileDoc(), `prefix: "job:a:"`, `prefix: "job:a:x:"`, 1)
	rewrite(shrunk)
	s.p.waitLog(reloaded, 1)
	for i, c := range []*http.Client{c1, c2} {
		r := send(c, "GET", "/v1/leases/job:a:1", "")
		if r.st != 403 || !r.reused || (i == 1 && r.proto != "HTTP/2.0") {
			t.Errorf("client %d after the prefix shrank, on its open connection: %+v, want 403 on a reused connection", i, r)
		}
		if r := send(c, "GET", "/v1/leases/job:a:x:1", ""); r.st != 200 {
			t.Errorf("client %d inside the new prefix: %+v", i, r)
		}
	}
	refusedWait("job:a:w", rel, waited, 403, "forbidden", "took it out of its prefix")

	rel, waited = wait("job:a:x:w")
	removed := strings.Replace(shrunk, "  - name: pool-a\n", "  - name: pool-gone\n", 1)
	removed = strings.Replace(removed, access.HashToken("tok-a"), access.HashToken("tok-other"), 1)
	rewrite(removed)
	s.p.waitLog(reloaded, 2)
	for i, c := range []*http.Client{c1, c2} {
		if r := send(c, "GET", "/v1/leases/job:a:x:1", ""); r.st != 401 {
			t.Errorf("client %d removed, on its open connection: %+v, want 401", i, r)
		}
	}
	refusedWait("job:a:x:w", rel, waited, 401, "unauthorized", "removed pool-a")

	// A file cut short keeps the one in force (pool-a still out).
	rewrite(accessFileDoc()[:40])
	s.p.waitLog(`"msg":"reload refused: the configuration in force stays","what":"FENCEGATE_ACCESS_FILE `+s.file, 1)
	if r := send(c1, "GET", "/v1/leases/job:a:x:1", ""); r.st != 401 && r.st != 429 {
		t.Errorf("after a refused reload pool-a: %+v", r)
	}
	if err := s.p.stop(); err != nil {
		t.Fatalf("exit: %v", err)
	}
}
