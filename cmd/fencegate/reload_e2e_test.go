//go:build unix

package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/fencegate/fencegate/internal/certs/certstest"
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
