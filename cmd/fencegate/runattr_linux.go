package main

import "syscall"

// commandAttr puts CMD in a process group of its own (see runUnderLease)
// and asks the kernel to send it SIGTERM if fencegate run itself dies
// without forwarding anything (SIGKILL, the OOM killer): nothing then
// renews the lease, and CMD should not work on as if it held it. Only CMD
// gets it (the kernel's parent-death signal goes to a direct child), and
// nothing escalates to SIGKILL; a CMD that goes on is fenced by the lease
// expiring after its TTL.
func commandAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
