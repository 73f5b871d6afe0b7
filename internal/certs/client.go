package certs

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
)

// ClientFiles name the PEM files a client of a TLS listener uses.
type ClientFiles struct {
	// CAFile, when set, holds the CA certificates that verify the server
	// (a private CA); empty means the system roots.
	CAFile string
	// CertFile and KeyFile, when set (both or neither), are the client
	// certificate and key presented to a mutual-TLS listener.
	CertFile, KeyFile string
}

// ClientConfig returns client TLS settings for files: TLS 1.2 or later,
// the server verified by CAFile (or the system roots), and the client
// certificate, if any. The certificate pair is read now, so a mistake
// shows at once, and again at a handshake after the files changed on disk
// (short-lived certificates, such as SPIFFE's, rotate under a long-running
// client); a pair that then fails to load leaves the last good one in use.
func ClientConfig(files ClientFiles) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if files.CAFile != "" {
		pool, err := LoadPool(files.CAFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if (files.CertFile == "") != (files.KeyFile == "") {
		return nil, errors.New("a client certificate needs both its certificate file and its key file")
	}
	if files.CertFile != "" {
		r := &clientPair{files: Files{CertFile: files.CertFile, KeyFile: files.KeyFile}}
		if err := r.refresh(); err != nil {
			return nil, err
		}
		c.GetClientCertificate = r.get
	}
	return c, nil
}

// clientPair is a client certificate re-read when its files change.
type clientPair struct {
	files Files
	mu    sync.Mutex
	cur   *loaded
}

func (p *clientPair) refresh() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil && sameStamps(stamps(p.files), p.cur.stamp) {
		return nil
	}
	l, err := load(p.files)
	if err != nil {
		return fmt.Errorf("client %w", err)
	}
	p.cur = l
	return nil
}

func (p *clientPair) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	_ = p.refresh() // on failure the last good pair stays
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur.cert, nil
}
