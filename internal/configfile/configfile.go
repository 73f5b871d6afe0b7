// Package configfile reads the files fencegate re-reads while it runs
// (the write gate's rules, the lease API's access file, the TLS
// certificates, keys and CA bundles), at start-up and on reload alike.
//
// A reload runs while the process serves, and the process must never wait
// on one for ever: Read opens without blocking (O_NONBLOCK, so a FIFO put
// in a file's place does not wait for a writer), refuses anything but a
// regular file (after following symbolic links, so a Kubernetes
// ConfigMap's or Secret's ..data link still works) and reads at most
// MaxBytes, so a file linked to /dev/zero or a log grown by mistake
// cannot fill the memory. A file on a hung network mount can still block
// the open or the read: callers must not wait on a reload without bound.
package configfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
)

// MaxBytes is the largest file Read reads: far beyond any rules, access
// file or PEM bundle (the system's whole CA bundle is some 200 KiB).
const MaxBytes = 4 << 20

// Read returns the contents of the regular file name (symbolic links
// followed). Anything else (a FIFO, a device, a socket, a directory), or a
// file larger than MaxBytes, is an error naming name; so is any error of
// the open or the read.
func Read(name string) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|openFlags, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is %s, not a regular file", name, kind(fi.Mode()))
	}
	if fi.Size() > MaxBytes {
		return nil, tooLarge(name)
	}
	// The size may change while the file is read (a file written in
	// place): the limit holds whatever it grows to.
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	if len(b) > MaxBytes {
		return nil, tooLarge(name)
	}
	return b, nil
}

func tooLarge(name string) error {
	return fmt.Errorf("%s is larger than %d MiB, the most a configuration file may hold", name, MaxBytes>>20)
}

// kind names the type of a file that is not a regular one.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO (named pipe)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "of type " + m.Type().String()
}
