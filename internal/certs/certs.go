// Package certs is a reloadable source of TLS server certificates for
// fencegate's listeners, and the matching client-side settings.
//
// A Source holds a certificate and key pair (PEM files) and, for mutual
// TLS, a bundle of client CAs. Its TLSConfig hands every new handshake the
// pair and bundle in force at that moment, so Reload (on SIGHUP, or when
// Watch sees the files change) rotates them without touching open
// connections: they keep the certificate they were made with. A Reload
// whose files do not load returns the error and changes nothing: the pair
// in force stays, so a half-written or mismatched file never takes a
// listener down.
//
// The package knows no listener: the lease API and the write gate use the
// same Source.
package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/internal/configfile"
)

// NextProtos is what a Source's TLSConfig offers by ALPN: HTTP/2 first,
// then HTTP/1.1.
var NextProtos = []string{"h2", "http/1.1"}

// Files names the PEM files of a listener's TLS settings.
type Files struct {
	// CertFile holds the certificate chain, leaf first. Required.
	CertFile string
	// KeyFile holds the private key of the leaf. Required.
	KeyFile string
	// ClientCAFile, when set, holds the CA certificates that verify client
	// certificates: every client must then present one (mutual TLS).
	ClientCAFile string
}

// loaded is one consistent set of TLS material, replaced whole on reload.
type loaded struct {
	cert      *tls.Certificate
	clientCAs *x509.CertPool // nil without mutual TLS
	stamp     []fileStamp    // the files as they were when read, for Watch
	// handshake is what every handshake gets while this set is in force:
	// one configuration, never changed once made, so a handshake
	// allocates none and a connection keeps none of its own.
	handshake *tls.Config
}

// Source serves the current certificate pair (and client CAs) to TLS
// handshakes. It is safe for concurrent use.
type Source struct {
	files Files
	cur   atomic.Pointer[loaded]
	mu    sync.Mutex // serialises Reload
}

// New loads files and returns a Source serving them. Errors name the file
// that did not load.
func New(files Files) (*Source, error) {
	if files.CertFile == "" || files.KeyFile == "" {
		return nil, errors.New("certs: a certificate file and a key file are both required")
	}
	s := &Source{files: files}
	l, err := load(files)
	if err != nil {
		return nil, err
	}
	s.cur.Store(l)
	return s, nil
}

// Files returns the files the Source reads.
func (s *Source) Files() Files { return s.files }

// MutualTLS reports whether clients must present a certificate.
func (s *Source) MutualTLS() bool { return s.files.ClientCAFile != "" }

// Reload reads the files again. When they load, new handshakes get the new
// pair and client CAs; when they do not, nothing changes and the error
// (naming the file) is returned for the log.
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := load(s.files)
	if err != nil {
		return err
	}
	s.cur.Store(l)
	return nil
}

// Certificate returns the certificate pair in force.
func (s *Source) Certificate() *tls.Certificate { return s.cur.Load().cert }

// TLSConfig returns a server configuration that takes its certificate and
// client CAs from the Source at each handshake: TLS 1.2 or later, ALPN h2
// and http/1.1, and, with a client CA bundle, a verified client
// certificate required.
func (s *Source) TLSConfig() *tls.Config {
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: NextProtos}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return s.cur.Load().handshake, nil
	}
	// Used only by code that inspects the base configuration (such as
	// net/http deciding whether a certificate is configured): every
	// handshake goes through GetConfigForClient.
	base.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cur.Load().cert, nil }
	return base
}

// Watch re-reads the files every interval when one of them changed on disk
// (size, modification time or inode), until ctx ends. onReload is called
// with each reload's result (nil on success). A pair caught half-written
// fails to load and is tried again at the next change or interval.
func (s *Source) Watch(ctx context.Context, interval time.Duration, onReload func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastErr []fileStamp // the stamps of the files that last failed to load
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := stamps(s.files)
		if sameStamps(now, s.cur.Load().stamp) || sameStamps(now, lastErr) {
			continue
		}
		err := s.Reload()
		if err != nil {
			lastErr = now
		} else {
			lastErr = nil
		}
		if onReload != nil {
			onReload(err)
		}
	}
}

func load(files Files) (*loaded, error) {
	st := stamps(files)
	cert, err := loadPair(files.CertFile, files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("certificate %s with key %s: %w", files.CertFile, files.KeyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certificate %s: %w", files.CertFile, err)
		}
	}
	l := &loaded{cert: &cert, stamp: st}
	if files.ClientCAFile != "" {
		if l.clientCAs, err = LoadPool(files.ClientCAFile); err != nil {
			return nil, &ClientCAError{Err: err}
		}
	}
	l.handshake = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   NextProtos,
		Certificates: []tls.Certificate{cert},
	}
	if l.clientCAs != nil {
		l.handshake.ClientAuth = tls.RequireAndVerifyClientCert
		l.handshake.ClientCAs = l.clientCAs
	}
	return l, nil
}

// loadPair is tls.LoadX509KeyPair with the files read by configfile.Read:
// a FIFO or a device in a file's place is refused, not waited on.
func loadPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := configfile.Read(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := configfile.Read(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// ClientCAError is the error of New and Reload when Files.ClientCAFile
// does not load (the pair did), found with errors.As: a caller can name
// the setting that gave that file rather than the certificate's.
type ClientCAError struct {
	Err error // names the file
}

func (e *ClientCAError) Error() string { return e.Err.Error() }
func (e *ClientCAError) Unwrap() error { return e.Err }

// LoadPool reads a PEM bundle of CA certificates (as configfile.Read
// reads: a regular file of at most configfile.MaxBytes). A file without
// one certificate is an error naming it.
func LoadPool(file string) (*x509.CertPool, error) {
	pem, err := configfile.Read(file)
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", file)
	}
	return pool, nil
}

// fileStamp is what Watch compares to tell that a file changed.
type fileStamp struct {
	size  int64
	mtime int64 // nanoseconds
	ino   uint64
	ok    bool
}

func stamps(files Files) []fileStamp {
	names := []string{files.CertFile, files.KeyFile, files.ClientCAFile}
	out := make([]fileStamp, len(names))
	for i, n := range names {
		if n == "" {
			continue
		}
		fi, err := os.Stat(n)
		if err != nil {
			continue
		}
		out[i] = fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano(), ino: inode(fi), ok: true}
	}
	return out
}

func sameStamps(a, b []fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
