package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// TestShellExample runs examples/shell/worker.sh under fencegate run
// against a real fencegate and the demo upstream: once to the end, once
// losing its lease mid-run (the API stops answering), after which the next
// worker resumes from the checkpoint with a higher token and the lost
// worker's token is refused at the gate.
func TestShellExample(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	worker, err := filepath.Abs("../../examples/shell/worker.sh")
	if err != nil {
		t.Fatal(err)
	}
	upstream := startDemoUpstream(t)
	// A write cut off mid-flight when the worker loses its lease keeps the
	// gate's barrier closed for the grace: a short one keeps the test fast.
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + upstream,
		"FENCEGATE_RULES=PUT,PATCH,DELETE /jobs/{id} fence job:{id}", "FENCEGATE_TIMEOUT_GRACE=1s",
	}, "api", "gate")
	api, gate := p.url("api", ""), p.url("gate", "")
	client := leaseapi.NewClient(api)
	ctx := context.Background()
	env := func(steps int) []string {
		// The worker calls fencegate: the binary under test goes first on PATH.
		return []string{"PATH=" + filepath.Dir(binary) + ":" + os.Getenv("PATH"), "FENCEGATE_API_URL=" + api,
			"GATE_URL=" + gate, "STEPS=" + strconv.Itoa(steps), "STEP_SECONDS=0.1"}
	}
	checkpointStep := func(resource string) int {
		t.Helper()
		cp, err := client.ReadCheckpoint(ctx, resource)
		if err != nil {
			return 0
		}
		var state struct{ Step int }
		if err := json.Unmarshal(cp.State, &state); err != nil {
			t.Fatalf("checkpoint state %s: %v", cp.State, err)
		}
		return state.Step
	}
	upstreamItem := func(path string) map[string]any {
		t.Helper()
		st, item, _ := call(t, "GET", upstream+path, nil, "")
		if st != 200 {
			t.Fatalf("upstream GET %s: %d", path, st)
		}
		return item
	}

	t.Run("to the end", func(t *testing.T) {
		r := fg(t, env(3), "", "run", "--resource", "job:42", "--ttl", "2s", "--finish-on-success", "--", "sh", worker)
		if r.code != 0 {
			t.Fatalf("run exited %d\n%s", r.code, r.stderr)
		}
		item := upstreamItem("/jobs/42")
		if body, _ := item["body"].(map[string]any); body["step"] != 3.0 || item["fencing_token"] != "1" {
			t.Fatalf("the upstream holds %v", item)
		}
		if st, err := client.Status(ctx, "job:42"); err != nil || st.Previous == nil || !st.Previous.Finished || st.Lease != nil {
			t.Fatalf("status after the worker finished: %+v, %v", st, err)
		}
	})

	t.Run("lease lost mid-run", func(t *testing.T) {
		first := startBG(t, env(1000), "run", "--resource", "job:43", "--ttl", "2s", "--kill-after", "5s", "--", "sh", worker)
		for limit := time.Now().Add(30 * time.Second); checkpointStep("job:43") < 2; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(limit) {
				t.Fatalf("the worker made no progress\n%s", first.stderr)
			}
		}
		st, err := client.Status(ctx, "job:43")
		if err != nil || st.Lease == nil {
			t.Fatalf("status: %+v, %v", st, err)
		}
		old := st.Lease.Token

		t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if code := first.wait(30 * time.Second); code != exitLeaseLost {
			t.Fatalf("run exited %d, want 76\n%s", code, first.stderr)
		}
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}

		stopped := checkpointStep("job:43")
		r := fg(t, env(stopped+2), "", "run", "--resource", "job:43", "--ttl", "2s", "--wait", "10s", "--finish-on-success", "--", "sh", worker)
		if r.code != 0 {
			t.Fatalf("the next worker exited %d\n%s", r.code, r.stderr)
		}
		item := upstreamItem("/jobs/43")
		tok, _ := strconv.ParseUint(item["fencing_token"].(string), 10, 64)
		if body, _ := item["body"].(map[string]any); body["step"] != float64(stopped+2) || fencing.Token(tok) <= old {
			t.Fatalf("the upstream holds %v; want step %d written with a token above %d", item, stopped+2, old)
		}
		st2, late, _ := call(t, "PUT", gate+"/jobs/43", map[string]string{"Fencing-Token": old.String()}, `{"step":999}`)
		if st2 != 409 || late["code"] != "stale-token" {
			t.Fatalf("a late write with the lost token: %d %v", st2, late)
		}
	})
}
