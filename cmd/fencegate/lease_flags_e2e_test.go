package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/leaseapi"
)

// TestLeaseAPIFlags: --api-url and --api-token-file take precedence over
// FENCEGATE_API_URL and FENCEGATE_API_TOKEN, for lease and run alike.
func TestLeaseAPIFlags(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_API_TOKEN=s3cret"}, "api")
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "token"), filepath.Join(dir, "wrong")
	if err := os.WriteFile(good, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The environment points elsewhere, with a wrong token: the flags win.
	env := []string{"FENCEGATE_API_URL=http://127.0.0.1:1", "FENCEGATE_API_TOKEN=wrong"}
	api := p.url("api", "")
	r := fg(t, env, "", "lease", "status", "job:1", "--api-url", api, "--api-token-file", good)
	if r.code != 0 || r.jsonLine(t)["resource"] != "job:1" {
		t.Fatalf("status with --api-url and --api-token-file: exit %d, stderr %q", r.code, r.stderr)
	}
	r = fg(t, env, "", "lease", "status", "job:1", "--api-url", api, "--api-token-file", bad)
	if r.code != exitRefused || r.problem(t)["code"] != "unauthorized" {
		t.Fatalf("a wrong token file: exit %d, stderr %q", r.code, r.stderr)
	}
	r = fg(t, env, "", "lease", "status", "job:1", "--api-url", api, "--api-token-file", filepath.Join(dir, "missing"))
	if r.code != exitUsage || !strings.Contains(r.stderr, "--api-token-file") {
		t.Fatalf("a missing token file: exit %d, stderr %q", r.code, r.stderr)
	}
	// A token that could not be sent in a header (a secret's trailing
	// newline) is named as such, exit 2, not an API that did not answer.
	r = fg(t, []string{"FENCEGATE_API_URL=" + api, "FENCEGATE_API_TOKEN=s3cret\n"}, "", "lease", "status", "job:1")
	if r.code != exitUsage || !strings.Contains(r.stderr, "FENCEGATE_API_TOKEN") || strings.Contains(r.stderr, "s3cret") {
		t.Fatalf("a token with a newline: exit %d, stderr %q", r.code, r.stderr)
	}
	r = fg(t, env, "", "lease", "status", "job:1", "--api-url", "ftp://x")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--api-url") {
		t.Fatalf("a bad --api-url: exit %d, stderr %q", r.code, r.stderr)
	}
	r = fg(t, env, "", "run", "--resource", "job:2", "--api-url", api, "--api-token-file", good, "--", "sh", "-c", `echo "$FENCEGATE_API_URL $FENCING_TOKEN"`)
	if out, tok, _ := strings.Cut(strings.TrimSpace(r.stdout), " "); r.code != 0 || out != api || !isToken(tok) {
		t.Fatalf("run with --api-url and --api-token-file: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestAcquireOutputToken: --output token prints the token alone, for
// T=$(fencegate lease acquire ... --output token).
func TestAcquireOutputToken(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	env := []string{"FENCEGATE_API_URL=" + p.url("api", "")}
	r := fg(t, env, "", "lease", "acquire", "job:1", "--owner", "a", "--output", "token")
	if r.code != 0 || !strings.HasSuffix(r.stdout, "\n") || !isToken(strings.TrimSuffix(r.stdout, "\n")) || r.stderr != "" {
		t.Fatalf("--output token: exit %d, stdout %q, stderr %q; want exactly the token", r.code, r.stdout, r.stderr)
	}
	r = fg(t, env, "", "lease", "acquire", "job:1", "--owner", "b", "-o", "token")
	if r.code != exitRefused || r.stdout != "" || r.problem(t)["code"] != "lease-held" {
		t.Fatalf("-o token, held: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := fg(t, env, "", "lease", "acquire", "job:1", "--owner", "a", "--output", "yaml"); r.code != exitUsage {
		t.Fatalf("--output yaml: exit %d, want 2", r.code)
	}
}

// fakeAcquireAPI answers lease-held to the first `held` acquisitions, then
// grants the lease; it records each acquisition's wait_seconds.
func fakeAcquireAPI(t *testing.T, held int) (*httptest.Server, func() []int64) {
	var mu sync.Mutex
	var waits []int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/acquire"):
			var body struct {
				Wait int64 `json:"wait_seconds"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			mu.Lock()
			waits = append(waits, body.Wait)
			n := len(waits)
			mu.Unlock()
			if n <= held {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusConflict)
				_, _ = w.Write([]byte(`{"type":"urn:fencegate:problem:lease-held","title":"Conflict","status":409,"code":"lease-held","detail":"held","holder":"other"}`))
				return
			}
			now := time.Now().UTC()
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"resource": "job:1", "owner": "me", "token": 7, "ttl_seconds": 30,
				"acquired_at": now.Format(time.RFC3339Nano), "expires_at": now.Add(30 * time.Second).Format(time.RFC3339Nano)})
		case strings.HasSuffix(r.URL.Path, "/release"):
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"released":true}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), waits...)
	}
}

// TestWaitForeverRepeatsBoundedWaits: --wait forever repeats the API's
// bounded waits (60 s each) until the lease is acquired, for lease acquire
// and run, after a first acquisition that asks for no wait (so that the
// command can say at once that it waits); --wait 0s asks once.
func TestWaitForeverRepeatsBoundedWaits(t *testing.T) {
	for _, args := range [][]string{
		{"lease", "acquire", "job:1", "--owner", "me", "--wait", "forever", "--output", "token"},
		{"run", "--resource", "job:1", "--owner", "me", "--wait", "forever", "--", "true"},
	} {
		srv, waits := fakeAcquireAPI(t, 2)
		r := fg(t, []string{"FENCEGATE_API_URL=" + srv.URL}, "", args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
		if got := waits(); len(got) != 3 || got[0] != 0 || got[1] != 60 || got[2] != 60 {
			t.Errorf("%v: acquisitions with wait_seconds %v, want 0, 60, 60", args, got)
		}
	}
	srv, waits := fakeAcquireAPI(t, 2)
	r := fg(t, []string{"FENCEGATE_API_URL=" + srv.URL}, "", "lease", "acquire", "job:1", "--owner", "me", "--wait", "0s")
	if r.code != exitRefused || len(waits()) != 1 || waits()[0] != 0 {
		t.Fatalf("--wait 0s: exit %d, acquisitions %v; want 3 after one without a wait", r.code, waits())
	}
	if r := fg(t, []string{"FENCEGATE_API_URL=" + srv.URL}, "", "lease", "acquire", "job:1", "--owner", "me", "--wait", "soon"); r.code != exitUsage {
		t.Fatalf("--wait soon: exit %d, want 2", r.code)
	}
}

// TestHealthHelpFlagStyle: health's help shows its flags as every other
// command does (--timeout, not -timeout).
func TestHealthHelpFlagStyle(t *testing.T) {
	r := fg(t, nil, "", "health", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--timeout duration") || strings.Contains(r.stdout, "  -timeout") {
		t.Fatalf("health --help: exit %d, stdout %q", r.code, r.stdout)
	}
}

// isToken reports whether s is a token as the CLI prints it: a positive
// decimal number alone (tokens follow the store's clock).
func isToken(s string) bool {
	n, err := strconv.ParseUint(s, 10, 64)
	return err == nil && n > 0 && strconv.FormatUint(n, 10) == s
}

// TestWaitsAskedNeverOutlastTheWait: every attempt of a --wait asks the API
// to wait whole seconds (the unit it waits in), never more than the whole
// --wait: the time left is rounded down, so a lease that frees after --wait
// is over is not taken (under a second left, an attempt asks for no wait).
// --wait 200ms used to ask for a second.
func TestWaitsAskedNeverOutlastTheWait(t *testing.T) {
	c := &cli{stdout: io.Discard, stderr: io.Discard}
	held := &leaseapi.ProblemError{Status: http.StatusConflict, Code: "lease-held", Type: problem.TypePrefix + "lease-held"}
	for _, d := range []time.Duration{200 * time.Millisecond, 1500 * time.Millisecond} {
		var asked []time.Duration
		err := c.acquireWaiting(context.Background(), "fencegate", "job:1", waitFlag{d: d}, func(_ context.Context, wait time.Duration) error {
			asked = append(asked, wait)
			return held
		})
		if !errors.Is(err, fencing.ErrLeaseHeld) || len(asked) < 2 {
			t.Fatalf("--wait %v: %v after %d attempts, want lease-held after a few", d, err, len(asked))
		}
		for _, w := range asked {
			if w%time.Second != 0 || w > d {
				t.Errorf("--wait %v: an attempt asked the API to wait %v (all: %v), want whole seconds within the wait", d, w, asked)
			}
		}
	}
}
