package tiedproc

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Start starts cmd so that the kernel sends it sig when the test binary
// ends, however it ends (Pdeathsig). The signal goes to cmd's own process
// only: a server that forks workers must end them itself on sig, as
// PostgreSQL's postmaster does on SIGINT.
//
// The kernel sends the signal when the thread that started the process
// exits, not the process. So every process is started from one OS thread
// that lives as long as the binary, locked and never released: the signal
// comes only when the binary ends, not when an arbitrary runtime thread does.
func Start(cmd *exec.Cmd, sig syscall.Signal) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
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
