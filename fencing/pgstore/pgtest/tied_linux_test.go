package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/tiedproc"
)

// TestServerEndsWithKilledBinary runs a copy of this test binary that
// starts a cluster and then waits, kills that copy with SIGKILL (no
// cleanup runs), and checks that the server it started ends by itself:
// the postmaster, started as another user, gets its SIGINT and ends its
// backends.
func TestServerEndsWithKilledBinary(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		c, err := New()
		if err != nil {
			fmt.Println("ERROR", err)
			return
		}
		fmt.Println("STARTED", c.PID(), c.dir)
		time.Sleep(time.Minute) // killed long before
		return
	}
	c := Start(t) // skips when PostgreSQL is missing (and may), like every test here
	c.Remove()

	child := exec.Command(os.Args[0], "-test.run=^TestServerEndsWithKilledBinary$", "-test.count=1")
	child.Env = append(os.Environ(), "PGTEST_CHILD=1")
	started := tiedproc.KillStarted(t, child)
	pid, err := strconv.Atoi(started[0])
	if err != nil || len(started) < 2 {
		t.Fatalf("the child reported %q", started)
	}
	t.Cleanup(func() { os.RemoveAll(started[1]) })
	if !tiedproc.WaitEnded(pid, 30*time.Second) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the server (pid %d) outlived the killed test binary by 30 s", pid)
	}
}
