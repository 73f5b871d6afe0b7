//go:build unix

package configfile

import "syscall"

// openFlags opens without waiting: a FIFO opens at once, without a
// writer, and is then refused for what it is.
const openFlags = syscall.O_NONBLOCK
