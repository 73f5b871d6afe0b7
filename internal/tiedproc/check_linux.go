package tiedproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// What a test of a tied process needs: a copy of the test binary that
// starts one and is then killed, and a look at whether that process ended.

// KillStarted starts child, a copy of the test binary told by its
// environment to start a process with Start and then print a line
// "STARTED" followed by what the test needs to know of it (its pid first),
// and to wait. It reads that line, kills child with SIGKILL (so no cleanup
// of child's runs) and reaps it, and returns the line's fields after
// "STARTED". A line "ERROR ..." or no STARTED line fails t.
func KillStarted(t testing.TB, child *exec.Cmd) []string {
	t.Helper()
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var fields []string
	for sc := bufio.NewScanner(out); sc.Scan(); {
		line := sc.Text()
		if strings.HasPrefix(line, "ERROR") {
			_ = child.Process.Kill()
			_ = child.Wait()
			t.Fatalf("the child could not start its process: %s", line)
		}
		if f := strings.Fields(line); len(f) > 1 && f[0] == "STARTED" {
			fields = f[1:]
			break
		}
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	if fields == nil {
		t.Fatal("the child reported no process")
	}
	return fields
}

// WaitEnded reports whether process pid ends within d.
func WaitEnded(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !Alive(pid) {
			return true
		}
	}
	return false
}

// Alive reports whether process pid runs (a zombie has ended).
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}
