package pgtest

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// startTied starts cmd so that the server dies with the test binary, even
// one killed by go test's -timeout or a signal (deferred cleanups do not run
// then): the kernel sends the postmaster SIGINT (fast shutdown) when its
// parent thread exits (Pdeathsig). The parent is one OS thread that lives
// as long as the process, locked and never released, so the signal comes
// only when the binary ends, not when an arbitrary runtime thread does.
func startTied(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGINT
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the process
			for f := range spawns {
				f()
			}
		}()
	})
	errc := make(chan error, 1)
	spawns <- func() { errc <- cmd.Start() }
	return <-errc
}

var (
	spawnOnce sync.Once
	spawns    = make(chan func())
)
