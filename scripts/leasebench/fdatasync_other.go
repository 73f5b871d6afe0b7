//go:build !linux

package main

import "os"

// fdatasync flushes f to its disk; without fdatasync, with fsync.
func fdatasync(f *os.File) error { return f.Sync() }
