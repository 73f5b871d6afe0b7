//go:build unix

package configfile

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadRefusesWhatIsNotARegularFile: a FIFO (no writer: a blocking
// open would wait for ever), a link to /dev/zero (a read would never end),
// a directory and a file beyond MaxBytes are refused at once, naming the
// file; a regular file, also through a chain of links as a Kubernetes
// volume lays it out, is read.
func TestReadRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("#\n"), MaxBytes/2+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, want string }{
		{fifo, "is a FIFO (named pipe), not a regular file"},
		{zero, "is a character device, not a regular file"},
		{dir, "is a directory, not a regular file"},
		{big, "is larger than 4 MiB"},
	} {
		done := make(chan error, 1)
		go func() { _, err := Read(tc.name); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.name+" "+tc.want) {
				t.Errorf("Read(%s): %v, want an error with %q", tc.name, err, tc.name+" "+tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Read(%s) has not returned in 10s", tc.name)
		}
	}

	v1 := filepath.Join(dir, "..v1")
	if err := os.Mkdir(v1, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v1, "rules"), []byte("PUT /x pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "rules")
	if err := os.Symlink("..data/rules", link); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(link); err != nil || string(b) != "PUT /x pass\n" {
		t.Errorf("Read through links: %q %v", b, err)
	}
	exact := filepath.Join(dir, "exact")
	if err := os.WriteFile(exact, bytes.Repeat([]byte("#"), MaxBytes), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(exact); err != nil || len(b) != MaxBytes {
		t.Errorf("Read of a file of MaxBytes: %d bytes, %v", len(b), err)
	}
	if _, err := Read(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("Read of a missing file: %v, want a not-exist error", err)
	}
}
