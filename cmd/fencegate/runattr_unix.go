//go:build !linux && !windows

package main

import "syscall"

// commandAttr puts CMD in a process group of its own (see runUnderLease).
// Outside Linux the kernel has no parent-death signal: if fencegate run is
// killed, CMD runs on until the lease expires and fences its writes.
func commandAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
