package main

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data to its disk, as the file store's commits do.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
