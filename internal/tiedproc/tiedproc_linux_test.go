package tiedproc

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// childEnv makes this test binary, run again as a child, start a long
// sleep (tied or not, by its value), print the sleep's pid and wait to be
// killed.
const childEnv = "TIEDPROC_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		cmd := exec.Command("sleep", "60")
		var err error
		if mode == "tied" {
			err = Start(cmd, syscall.SIGKILL)
		} else {
			err = cmd.Start()
		}
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(3)
		}
		fmt.Println("STARTED", cmd.Process.Pid)
		time.Sleep(time.Minute) // killed long before
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestProcessEndsWithKilledBinary kills a test binary with SIGKILL (no
// cleanup runs) and checks that the process it started with Start ends by
// itself, while one started with cmd.Start outlives it (the case Start
// exists for, and proof that the check can fail).
func TestProcessEndsWithKilledBinary(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"tied", "untied"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), childEnv+"="+mode)
			pid, err := strconv.Atoi(KillStarted(t, child)[0])
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			// A parent-death signal comes at once: 30 s only tells a slow
			// machine from a process left running; the untied one is
			// given a second to show it is not ended by the binary too.
			wait := 30 * time.Second
			if mode == "untied" {
				wait = time.Second
			}
			ended := WaitEnded(pid, wait)
			switch {
			case mode == "tied" && !ended:
				t.Fatalf("the tied process (pid %d) outlived the killed binary by %v", pid, wait)
			case mode == "untied" && ended:
				t.Fatalf("the untied process (pid %d) ended with the binary: the check proves nothing", pid)
			}
		})
	}
}

// TestStartFromManyGoroutines starts processes from goroutines whose OS
// threads come and go, and checks that each starts and is left alone by
// the signal while the binary lives.
func TestStartFromManyGoroutines(t *testing.T) {
	t.Parallel()
	const n = 16
	cmds := make([]*exec.Cmd, n)
	errs := make(chan error, n)
	for i := range cmds {
		cmds[i] = exec.Command("sleep", "60")
		go func() { errs <- Start(cmds[i], syscall.SIGKILL) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // a thread-death signal would have come by now
	for _, cmd := range cmds {
		if !Alive(cmd.Process.Pid) {
			t.Errorf("pid %d ended while the binary lives", cmd.Process.Pid)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}
