//go:build !unix

package boltstore

import (
	"os"
	"time"
)

// lockMarker does nothing here: the store file's own lock is the only one
// (see markerlock_unix.go).
func lockMarker(*os.File, time.Duration) error { return nil }
