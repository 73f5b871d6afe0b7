//go:build unix

package boltstore

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// lockMarker takes an exclusive lock on the open marker f, waiting up to
// timeout for another holder to let go. The store file's own lock (bbolt's)
// is on the file's inode: a file deleted or replaced under a running
// fencegate leaves that one locking a file no one else opens, and a second
// fencegate would start on the new file beside it. The marker outlives such
// a loss (that is its purpose), so its lock keeps the second one out. The
// lock ends when f is closed.
func lockMarker(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) || !time.Now().Before(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
