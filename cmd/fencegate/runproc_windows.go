package main

import (
	"errors"
	"syscall"
)

// runAvailable: fencegate run keeps CMD and its lease together with what
// Windows lacks, a process group it can signal as a whole and POSIX
// signals to forward (SIGTERM when the lease is lost, SIGKILL for what CMD
// leaves behind). It refuses rather than run CMD with a weaker promise.
// Every other command builds for Windows (the tests run on Linux only).
func runAvailable() error {
	return errors.New("fencegate run is not available on Windows: it needs process groups and POSIX signals to stop the command when its lease is lost; hold the lease with `fencegate lease` or a client library (see docs/workers.md) instead")
}

func ignoreJobStop() {}

func signalGroup(int, syscall.Signal) {}

func commandAttr() *syscall.SysProcAttr { return nil }
