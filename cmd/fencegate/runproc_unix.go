//go:build !windows

package main

import (
	"os/signal"
	"syscall"
)

// runAvailable reports why fencegate run cannot work here: on Unix it can.
func runAvailable() error { return nil }

// ignoreJobStop ignores the terminal's job-control stop (SIGTSTP): a
// stopped fencegate run could not renew the lease while CMD, in a process
// group of its own, went on.
func ignoreJobStop() { signal.Ignore(syscall.SIGTSTP) }

// signalGroup sends sig to CMD's process group (CMD leads it).
func signalGroup(pid int, sig syscall.Signal) {
	_ = syscall.Kill(-pid, sig)
}
