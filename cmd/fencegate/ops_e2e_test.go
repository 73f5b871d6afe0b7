package main

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runBinary runs the fencegate binary (see fg) and returns its exit status
// and its output, stdout then stderr.
func runBinary(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	r := fg(t, env, "", args...)
	return r.code, r.stdout + r.stderr
}

func TestCheckExitStatus(t *testing.T) {
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules")
	if err := os.WriteFile(rulesFile, []byte("PUT /jobs/{id} fence job:{id}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unendedFile := filepath.Join(dir, "unended")
	if err := os.WriteFile(unendedFile, []byte("# rules\nPUT /jobs/{id} fence job:{id}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     []string
		code    int
		want    []string
		notWant []string
	}{
		{"defaults", nil, 0, []string{"FENCEGATE_STORE", "file:fencegate.db", "default", "write gate: off", "configuration ok"}, nil},
		{"rules file with an unended last rule", []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000", "FENCEGATE_RULES_FILE=" + unendedFile}, 0, []string{"warning: line 2, the rules file's last rule, has no line end", "configuration ok"}, nil},
		{"rules file ended", []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000", "FENCEGATE_RULES_FILE=" + rulesFile}, 0, []string{"configuration ok"}, []string{"no line end"}},
		{"resource header resolved without rules", []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000"}, 0, []string{"auto (true)"}, []string{"auto (false)"}},
		{"resource header resolved with rules", []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000", "FENCEGATE_RULES_FILE=" + rulesFile}, 0, []string{"auto (false)"}, []string{"auto (true)"}},
		{"resource header as set", []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000", "FENCEGATE_RULES_FILE=" + rulesFile, "FENCEGATE_RESOURCE_HEADER=true"}, 0, []string{"configuration ok"}, []string{"auto (true)", "auto (false)"}},
		{"gate with rules file and secrets",
			[]string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000", "FENCEGATE_RULES_FILE=" + rulesFile,
				"FENCEGATE_API_TOKEN=tok-s3cret", "FENCEGATE_STORE=valkey://u:hunter2@127.0.0.1:6379/0",
				"FENCEGATE_API_URL=http://127.0.0.1:7070"},
			0, []string{"write gate: on, 1 route rules", "line 1: PUT /jobs/{id} -> fence job:{id}", "(redacted)", "valkey://u:xxxxx@127.0.0.1:6379/0", "FENCEGATE_API_URL", "environment"},
			[]string{"tok-s3cret", "hunter2"}},
		{"lease API open beyond loopback", []string{"FENCEGATE_API_ADDR=0.0.0.0:7070"}, 0, []string{"warning: the lease API listens beyond loopback without authentication", "configuration ok"}, nil},
		{"lease API beyond loopback with a token", []string{"FENCEGATE_API_ADDR=0.0.0.0:7070", "FENCEGATE_API_TOKEN=tok-s3cret"}, 0, []string{"configuration ok"}, []string{"without authentication"}},
		{"defaults say nothing of the API", nil, 0, []string{"configuration ok"}, []string{"without authentication"}},
		{"unknown variable", []string{"FENCEGATE_STOR=memory:"}, 2, []string{"FENCEGATE_STOR", "did you mean FENCEGATE_STORE"}, nil},
		{"bad bool", []string{"FENCEGATE_RESOURCE_HEADER=yes"}, 2, []string{"FENCEGATE_RESOURCE_HEADER", "true or false"}, []string{"strconv"}},
		{"bad port", []string{"FENCEGATE_API_ADDR=127.0.0.1:99999"}, 2, []string{"FENCEGATE_API_ADDR", "0 to 65535"}, nil},
		{"bad rules", []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000", "FENCEGATE_RULES=PUT /x/{id} fence job/{id}"}, 2, []string{"FENCEGATE_RULES", "line 1"}, nil},
		{"missing rules file", []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000", "FENCEGATE_RULES_FILE=" + filepath.Join(dir, "nope")}, 2, []string{"FENCEGATE_RULES_FILE"}, nil},
		{"missing CA file", []string{"FENCEGATE_VALKEY_CA_FILE=" + filepath.Join(dir, "nope.pem")}, 2, []string{"FENCEGATE_VALKEY_CA_FILE"}, nil},
		{"CA file without PEM", []string{"FENCEGATE_VALKEY_CA_FILE=" + rulesFile}, 2, []string{"FENCEGATE_VALKEY_CA_FILE", "no PEM"}, nil},
		{"arguments", nil, 2, []string{"no arguments"}, nil},
	} {
		args := []string{"check"}
		if tc.name == "arguments" {
			args = append(args, "extra")
		}
		code, out := runBinary(t, tc.env, args...)
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d\n%s", tc.name, code, tc.code, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", tc.name, w, out)
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(out, w) {
				t.Errorf("%s: output shows %q:\n%s", tc.name, w, out)
			}
		}
	}
}

// TestHealthAndForcedShutdown: fencegate health follows /readyz through a
// running process's life (ready, then draining after SIGTERM, then gone),
// and a second SIGTERM ends a long drain at once.
func TestHealthAndForcedShutdown(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_DRAIN_DELAY=10m"}, "api")
	apiEnv := []string{"FENCEGATE_API_ADDR=" + p.addr["api"]}
	if code, out := runBinary(t, apiEnv, "health"); code != 0 || !strings.Contains(out, "ready") {
		t.Fatalf("health of a ready fencegate: exit %d %q", code, out)
	}
	// A wildcard listen address is asked on loopback.
	_, port, _ := net.SplitHostPort(p.addr["api"])
	if code, out := runBinary(t, []string{"FENCEGATE_API_ADDR=0.0.0.0:" + port}, "health"); code != 0 {
		t.Fatalf("health via the wildcard address: exit %d %q", code, out)
	}
	if code, out := runBinary(t, nil, "health", "--url", p.url("api", "/livez")); code != 0 {
		t.Fatalf("health --url .../livez: exit %d %q", code, out)
	}
	if code, out := runBinary(t, nil, "health", "--bogus"); code != 2 {
		t.Fatalf("health --bogus: exit %d %q, want 2", code, out)
	}
	if code, out := runBinary(t, nil, "health", "--url", p.url("api", "/no-such-path")); code != 1 {
		t.Fatalf("health of a 404: exit %d %q, want 1", code, out)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, `"msg":"draining"`)
	if code, out := runBinary(t, apiEnv, "health"); code != 1 || !strings.Contains(out, "draining") {
		t.Fatalf("health of a draining fencegate: exit %d %q, want 1 naming draining", code, out)
	}
	// The drain would last 10 minutes; the second signal ends it now.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := p.wait(30 * time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("after a second SIGTERM: %v, want exit status 1\n%s", err, p.logs)
	}
	waitLog(t, p, "second signal")
	if code, out := runBinary(t, apiEnv, "health"); code != 1 {
		t.Fatalf("health of a stopped fencegate: exit %d %q, want 1", code, out)
	}
}

// waitLog waits until the process has logged s.
func waitLog(t *testing.T, p *proc, s string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("fencegate did not log %q:\n%s", s, p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
