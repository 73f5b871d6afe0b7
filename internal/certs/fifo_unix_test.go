//go:build unix

package certs_test

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/certs"
	"github.com/fencegate/fencegate/internal/certs/certstest"
)

// TestReloadRefusesWhatIsNotARegularFile: a certificate, key or client CA
// file replaced by a FIFO (a read waits for a writer for ever) or a link to
// /dev/zero (a read never ends) fails Reload at once, naming the file and
// what it is, and the pair in force stays; New refuses them alike.
func TestReloadRefusesWhatIsNotARegularFile(t *testing.T) {
	set := certstest.New(t)
	files := certs.Files{CertFile: set.ServerCert, KeyFile: set.ServerKey, ClientCAFile: set.CAFile}
	src, err := certs.New(files)
	if err != nil {
		t.Fatal(err)
	}
	serial := set.Server.Cert.SerialNumber.String()
	for _, file := range []string{set.ServerCert, set.ServerKey, set.CAFile} {
		saved, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			what    string
			replace func() error
		}{
			{"a FIFO (named pipe)", func() error { return syscall.Mkfifo(file, 0o600) }},
			{"a character device", func() error { return os.Symlink("/dev/zero", file) }},
		} {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
			if err := tc.replace(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- src.Reload() }()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Reload with %s as %s has not returned in 10s", tc.what, file)
			}
			want := file + " is " + tc.what + ", not a regular file"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Reload with %s as %s: %v, want an error with %q", tc.what, file, err, want)
			}
			if isCA := errors.As(err, new(*certs.ClientCAError)); isCA != (file == set.CAFile) {
				t.Errorf("Reload with %s as %s: ClientCAError %v", tc.what, file, isCA)
			}
			if _, err := certs.New(files); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("New with %s as %s: %v, want an error with %q", tc.what, file, err, want)
			}
			if got := src.Certificate().Leaf.SerialNumber.String(); got != serial {
				t.Errorf("after a refused reload the pair in force is %s, want %s", got, serial)
			}
		}
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		certstest.WriteFile(t, file, saved)
	}
	if err := src.Reload(); err != nil {
		t.Errorf("Reload of the files restored: %v", err)
	}
}
