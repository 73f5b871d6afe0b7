package pgtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServerEndsWithKilledBinary runs a copy of this test binary that
// starts a cluster and then waits, kills that copy with SIGKILL (no
// cleanup runs), and checks that the server it started ends by itself.
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
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	var dir string
	for sc := bufio.NewScanner(out); sc.Scan(); {
		if line := sc.Text(); strings.HasPrefix(line, "ERROR") {
			t.Fatalf("the child could not start a cluster: %s", line)
		} else if _, err := fmt.Sscanf(line, "STARTED %d %s", &pid, &dir); err == nil {
			break
		}
	}
	if pid == 0 {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatal("the child reported no server")
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the server (pid %d) outlived the killed test binary by 30 s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether process pid runs (a zombie has ended).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}
