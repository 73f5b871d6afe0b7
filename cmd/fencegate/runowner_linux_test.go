package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegate/fencegate/leaseapi"
)

// TestDefaultOwnersDifferAcrossPIDNamespaces: two `fencegate run` that are
// each pid 1 of their own PID namespace on one host (two containers with
// fencegate as the entrypoint, sharing the host's name) get different
// default owners, so the second waits for the first's lease instead of
// taking it as the same owner (extended, same token) and running its
// command beside the first's under one token. With HOST:PID alone, both
// were "HOST:1" and both commands ran.
func TestDefaultOwnersDifferAcrossPIDNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for unshare --pid")
	}
	if err := exec.Command("unshare", "--pid", "--fork", "true").Run(); err != nil {
		t.Skipf("unshare --pid does not work here: %v", err)
	}
	api := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api").url("api", "")
	d := t.TempDir()
	const script = `echo "$FENCING_OWNER" > "$D/$N"; while [ ! -e "$D/stop" ]; do sleep 0.05; done`
	run := func(n string) *bgProc {
		return runBG(t, []string{"FENCEGATE_API_URL=" + api, "D=" + d, "N=" + n}, exec.Command("unshare", "--pid", "--fork", "--kill-child",
			binary, "run", "--resource", "job:ns", "--ttl", "5s", "--wait", "2s", "--", "sh", "-c", script))
	}
	a := run("a")
	waitFile(t, filepath.Join(d, "a"), 30*time.Second, a)
	b := run("b")
	code := b.wait(30 * time.Second) // b waits out its 2 s for a's lease
	st, err := leaseapi.NewClient(api).Status(context.Background(), "job:ns")
	_ = os.WriteFile(filepath.Join(d, "stop"), nil, 0o644)
	a.wait(30 * time.Second)
	if _, ran := os.Stat(filepath.Join(d, "b")); ran == nil {
		t.Fatalf("two fencegate run in separate PID namespaces ran their commands at once, as %q and %q (lease %+v, %v)",
			readFile(t, filepath.Join(d, "a")), readFile(t, filepath.Join(d, "b")), st.Lease, err)
	}
	if code != exitNotAcquired {
		t.Fatalf("the second run exited %d, want %d (lease-held)\n%s", code, exitNotAcquired, b.stderr)
	}
}
