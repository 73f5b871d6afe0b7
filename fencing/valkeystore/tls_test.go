package valkeystore

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
	"github.com/fencegate/fencegate/internal/freeport"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and returns
// the cert and key paths and a pool trusting it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fencegate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := strconv.Itoa(port)
	valkeytest.Start(t, valkeytest.WithArgs("--tls-port", tlsPort, "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", certFile, "--tls-auth-clients", "no"))
	url := "valkeys://127.0.0.1:" + tlsPort
	if _, err := Open(context.Background(), Options{URL: url, DialTimeout: time.Second}); err == nil {
		t.Fatal("Open over TLS trusted an unknown certificate authority")
	}
	s, err := Open(context.Background(), Options{URL: url, KeyPrefix: "tls", TLSConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatalf("Open over TLS: %v", err)
	}
	defer s.Close()
	lease, err := s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "t", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(context.Background(), fencing.AdmitRequest{Resource: "t", Token: lease.Token}); err != nil {
		t.Fatal(err)
	}
	// Mark readers speak plain TCP: over TLS there are none.
	if r, err := s.OpenMarkReader(context.Background()); r != nil || err != nil {
		t.Fatalf("OpenMarkReader over TLS: %v, %v; want none", r, err)
	}
}

func TestOpenWarnsWithoutPersistence(t *testing.T) {
	srv := valkeytest.Start(t)
	var buf bytes.Buffer
	s, err := Open(context.Background(), Options{URL: srv.URL(), Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if !strings.Contains(buf.String(), "persistence is off") {
		t.Fatalf("no persistence warning logged: %q", buf.String())
	}
	buf.Reset()
	persistent := valkeytest.Start(t, valkeytest.WithPersistence())
	s, err = Open(context.Background(), Options{URL: persistent.URL(), Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if buf.Len() != 0 {
		t.Fatalf("warning logged for a server with AOF: %q", buf.String())
	}
}
