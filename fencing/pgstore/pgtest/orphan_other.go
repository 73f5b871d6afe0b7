//go:build !linux

package pgtest

import "os/exec"

// startTied starts cmd. Only on Linux is the server tied to the test
// binary's life (see orphan_linux.go).
func startTied(cmd *exec.Cmd) error { return cmd.Start() }
