//go:build !linux

package tiedproc

import (
	"os/exec"
	"syscall"
)

// Start starts cmd. Only on Linux is the process tied to the test binary's
// life (see tiedproc_linux.go); sig is unused here.
func Start(cmd *exec.Cmd, sig syscall.Signal) error { return cmd.Start() }
