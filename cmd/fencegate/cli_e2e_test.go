package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/leaseapi"
)

// cliResult is what one run of the fencegate binary printed and how it
// exited.
type cliResult struct {
	stdout, stderr string
	code           int
}

// fg runs the fencegate binary with args, env (only) as its environment
// and stdin, and waits up to a minute for it.
func fg(t *testing.T, env []string, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Dir = t.TempDir()
	cmd.Stdin = strings.NewReader(stdin)
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("fencegate %v: %v", args, err)
	}
	return cliResult{stdout: out.String(), stderr: errb.String(), code: cmd.ProcessState.ExitCode()}
}

// jsonLine decodes stdout, which must be exactly one line of JSON.
func (r cliResult) jsonLine(t *testing.T) map[string]any {
	t.Helper()
	if strings.Count(r.stdout, "\n") != 1 || !strings.HasSuffix(r.stdout, "\n") {
		t.Fatalf("stdout is not one line: %q (stderr %q)", r.stdout, r.stderr)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatalf("stdout is not JSON: %q: %v", r.stdout, err)
	}
	return m
}

// problem decodes stderr, which must be one line of problem JSON.
func (r cliResult) problem(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if strings.Count(r.stderr, "\n") != 1 || json.Unmarshal([]byte(r.stderr), &m) != nil {
		t.Fatalf("stderr is not one line of problem JSON: %q", r.stderr)
	}
	return m
}

// afterWait is r with the report of a wait for another owner's lease
// taken off the front of stderr: at least one line from the command
// (`fencegate: `, `fencegate run: `) that is not JSON.
func (r cliResult) afterWait(t *testing.T) cliResult {
	t.Helper()
	rest, n := r.stderr, 0
	for strings.HasPrefix(rest, "fencegate: ") || strings.HasPrefix(rest, "fencegate run: ") {
		_, rest, _ = strings.Cut(rest, "\n")
		n++
	}
	if n == 0 {
		t.Fatalf("stderr does not begin with the report of a wait: %q", r.stderr)
	}
	r.stderr = rest
	return r
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, args := range [][]string{
		{}, {"serve"}, {"version"}, {"env"}, {"demo-upstream"}, {"run"}, {"completion"},
		{"lease"}, {"lease", "acquire"}, {"lease", "renew"}, {"lease", "release"},
		{"lease", "status"}, {"lease", "list"}, {"lease", "checkpoint"}, {"check"}, {"health"},
	} {
		// Were --help taken for an argument, serve and demo-upstream
		// would listen: keep them off the default ports.
		r := fg(t, []string{"FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_STORE=memory:"}, "", append(args, "--help")...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stdout, "fencegate "+strings.Join(args, " ")) {
			t.Errorf("fencegate %v --help: exit %d\nstdout %q\nstderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	api := []string{"FENCEGATE_API_URL=http://127.0.0.1:1"} // never reached
	for _, args := range [][]string{
		{"bogus"},
		{"--bogus"},
		{"serve", "extra"},
		{"version", "extra"},
		{"demo-upstream", "a", "b"},
		{"completion", "tcsh"},
		{"lease"},
		{"lease", "bogus"},
		{"lease", "acquire", "job:1"},        // no --owner
		{"lease", "acquire", "--owner", "a"}, // no resource
		{"lease", "acquire", "job:1", "job:2", "--owner", "a"}, // two
		{"lease", "acquire", "bad name", "--owner", "a"},       // invalid resource
		{"lease", "acquire", "job:1", "--owner", "a", "--ttl", "1.5s"},
		{"lease", "acquire", "job:1", "--owner", "a", "--ttl", "25h"},
		{"lease", "acquire", "job:1", "--owner", "a", "--ttl", "0s"}, // not the server's default
		{"lease", "renew", "job:1", "--owner", "a", "--token", "1", "--ttl", "0s"},
		{"lease", "renew", "job:1", "--owner", "a", "--token", "1", "--ttl", "-1s"},
		{"lease", "acquire", "job:1", "--owner", "a", "--wait", "-1s"},
		{"lease", "acquire", "job:1", "--owner", "a", "--wait", "sometimes"},
		{"lease", "acquire", "job:1", "--owner", "a", "--ttl", "soon"},
		{"lease", "acquire", "job:1", "--owner", "\x01"},
		{"lease", "renew", "job:1", "--owner", "a"}, // no --token
		{"lease", "renew", "job:1", "--owner", "a", "--token", "-1"},
		{"lease", "release", "job:1", "--token", "1"},
		{"lease", "status"},
		{"lease", "list", "extra"},
		{"lease", "list", "--limit", "-1"},
		{"lease", "checkpoint", "job:1", "--owner", "a"}, // saving needs all three
		{"lease", "checkpoint", "job:1", "--owner", "a", "--token", "1", "--state", "{not json"},
		{"run", "--resource", "job:1"}, // no command
		{"run", "--", "true"},          // no --resource
		{"run", "--resource", "job:1", "--ttl", "0s", "--", "true"},
		{"run", "--resource", "job:1", "--wait", "never", "--", "true"},
		{"run", "--resource", "job:1", "--owner", "", "--", "true"}, // not the default owner
	} {
		r := fg(t, api, "", args...)
		if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, "--help") {
			t.Errorf("fencegate %q: exit %d, want 2 with a hint on stderr\nstdout %q\nstderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	r := fg(t, []string{"FENCEGATE_API_URL=ftp://x"}, "", "lease", "status", "job:1")
	if r.code != exitUsage || !strings.Contains(r.stderr, "FENCEGATE_API_URL") {
		t.Errorf("a bad FENCEGATE_API_URL: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestVersionFlags(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-v"}} {
		r := fg(t, nil, "", args...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "fencegate ") || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("fencegate %v: %d %q", args, r.code, r.stdout)
		}
	}
}

// TestCompletionScripts checks that each shell accepts its script, and
// that completion offers the lease commands and live resources (fish
// runs the real completion end to end; bash's needs the bash-completion
// package, which the script's own syntax check does not).
func TestCompletionScripts(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		t.Run(shell, func(t *testing.T) {
			if _, err := exec.LookPath(shell); err != nil {
				t.Skipf("%s is not installed (scripts/test.sh installs it)", shell)
			}
			r := fg(t, nil, "", "completion", shell)
			if r.code != 0 || !strings.Contains(r.stdout, "fencegate") {
				t.Fatalf("completion %s: %d %q", shell, r.code, r.stderr)
			}
			script := filepath.Join(t.TempDir(), "fencegate."+shell)
			if err := os.WriteFile(script, []byte(r.stdout), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(shell, "-n", script).CombinedOutput(); err != nil {
				t.Fatalf("%s -n rejects the script: %v\n%s", shell, err, out)
			}
		})
	}

	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	if _, err := leaseapi.NewClient(p.url("api", "")).Acquire(context.Background(), "job:77", leaseapi.AcquireOptions{Owner: "w"}); err != nil {
		t.Fatal(err)
	}
	env := []string{"FENCEGATE_API_URL=" + p.url("api", "")}
	r := fg(t, env, "", "__complete", "lease", "")
	for _, sub := range []string{"acquire", "renew", "release", "status", "list", "checkpoint"} {
		if !strings.Contains(r.stdout, "\n"+sub+"\t") && !strings.HasPrefix(r.stdout, sub+"\t") {
			t.Errorf("completing 'lease ' does not offer %s:\n%s", sub, r.stdout)
		}
	}
	if r := fg(t, env, "", "__complete", "lease", "status", "job:"); !strings.HasPrefix(r.stdout, "job:77\n") {
		t.Errorf("completing 'lease status job:' does not offer the live lease job:77:\n%s%s", r.stdout, r.stderr)
	}

	if _, err := exec.LookPath("fish"); err == nil {
		dir := filepath.Dir(binary)
		cmd := exec.Command("fish", "--no-config", "-c", `fencegate completion fish | source; complete -C"fencegate lease st"`)
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), env[0])
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "status\t") {
			t.Errorf("fish completes 'fencegate lease st' to %q (%v), want status", out, err)
		}
	}
}
