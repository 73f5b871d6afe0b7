// Package tiedproc starts the servers a test needs (PostgreSQL, redis-server,
// nginx, a fencegate binary) so that they end with the test binary that
// started them, even one killed by go test's -timeout or by a signal, when
// deferred calls and t.Cleanup do not run. Without it such a server outlives
// its test and holds its port and files until someone kills it by hand.
//
// Only on Linux is a process tied (the kernel's parent-death signal); on
// other systems Start is cmd.Start.
package tiedproc
