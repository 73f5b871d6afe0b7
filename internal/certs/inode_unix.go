//go:build unix

package certs

import (
	"io/fs"
	"syscall"
)

// inode is the file's inode number: a file replaced by a rename (as
// Kubernetes updates a mounted Secret) may keep its size and time.
func inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
