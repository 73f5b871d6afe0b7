package hangup

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// The tests run themselves again as a child process (helperEnv names the
// case), which sends itself a SIGHUP before calling Handover or Release:
// the signal comes while hangup holds it, as one sent during start-up.
const helperEnv = "FENCEGATE_HANGUP_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "handover":
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			os.Exit(3)
		}
		time.Sleep(100 * time.Millisecond) // the signal has come and is held
		ch := make(chan os.Signal, 1)
		Handover(ch)
		select {
		case <-ch:
			os.Exit(0)
		case <-time.After(10 * time.Second):
			os.Exit(4) // the held signal was not passed on
		}
	case "release":
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			os.Exit(3)
		}
		time.Sleep(100 * time.Millisecond)
		Release()
		time.Sleep(10 * time.Second) // the re-raised signal ends the process first
		os.Exit(5)
	}
	os.Exit(m.Run())
}

func runHelper(t *testing.T, name string) error {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+name)
	return cmd.Run()
}

func TestHandoverPassesOnAHeldSignal(t *testing.T) {
	if err := runHelper(t, "handover"); err != nil {
		t.Fatalf("a SIGHUP sent before Handover: %v; want the process alive and the signal passed on to the server's channel", err)
	}
}

func TestReleaseRaisesAHeldSignalAgain(t *testing.T) {
	err := runHelper(t, "release")
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("a SIGHUP sent before Release: %v; want the process ended by SIGHUP", err)
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGHUP {
		t.Fatalf("a SIGHUP sent before Release: %v; want the process ended by SIGHUP, its default action", err)
	}
}
