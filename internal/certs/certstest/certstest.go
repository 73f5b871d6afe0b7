// Package certstest makes throwaway certificate authorities and
// certificates for tests of TLS listeners and clients: a CA, server
// certificates for loopback, and client certificates with URI (SPIFFE) and
// DNS SANs, written as PEM files in a test's temporary directory. It knows
// no listener.
package certstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that signs test certificates.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate in PEM, for a client's root pool or a
	// listener's client CA bundle.
	PEM []byte
}

// Pair is a signed certificate and its key.
type Pair struct {
	Cert    *x509.Certificate
	CertPEM []byte // the leaf certificate
	KeyPEM  []byte // PKCS #8
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a certificate pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server signs a server certificate for hosts (IP addresses or DNS names;
// none: 127.0.0.1, ::1 and localhost).
func (ca *CA) Server(t testing.TB, hosts ...string) Pair {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "::1", "localhost"}
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0]},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.sign(t, tmpl)
}

// ClientOptions describe a client certificate.
type ClientOptions struct {
	CommonName string
	URIs       []string // such as spiffe://corp/ns/ops/sa/reporting
	DNSNames   []string
}

// Client signs a client certificate.
func (ca *CA) Client(t testing.TB, o ClientOptions) Pair {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: o.CommonName},
		DNSNames:    o.DNSNames,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, raw := range o.URIs {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("certstest: URI SAN %q: %v", raw, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	return ca.sign(t, tmpl)
}

func (ca *CA) sign(t testing.TB, tmpl *x509.Certificate) Pair {
	t.Helper()
	key := newKey(t)
	tmpl.SerialNumber = serial(t)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	k, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Pair{
		Cert:    cert,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k}),
	}
}

// TLS is the pair as a tls.Certificate, for a client or server built in
// the test itself.
func (p Pair) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Write writes the pair as dir/name.crt and dir/name.key and returns
// their paths. Each file is replaced by a rename, as a rotation would.
func (p Pair) Write(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	WriteFile(t, certFile, p.CertPEM)
	WriteFile(t, keyFile, p.KeyPEM)
	return certFile, keyFile
}

// Write writes the CA certificate as dir/name.crt and returns its path.
func (ca *CA) Write(t testing.TB, dir, name string) string {
	t.Helper()
	f := filepath.Join(dir, name+".crt")
	WriteFile(t, f, ca.PEM)
	return f
}

// WriteFile replaces path with data through a rename, so a reader never
// sees it half-written.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Set is the usual arrangement, written in a temporary directory: one CA,
// a server certificate for loopback and a client certificate, with the
// paths of their files.
type Set struct {
	Dir                   string
	CA                    *CA
	CAFile                string
	Server                Pair
	ServerCert, ServerKey string
	Client                Pair
	ClientCert, ClientKey string
}

// New makes a Set in t.TempDir(); the client certificate has the URI SAN
// spiffe://test/client and the DNS SAN client.test.
func New(t testing.TB) *Set {
	t.Helper()
	s := &Set{Dir: t.TempDir(), CA: NewCA(t, "fencegate test CA")}
	s.CAFile = s.CA.Write(t, s.Dir, "ca")
	s.Server = s.CA.Server(t)
	s.ServerCert, s.ServerKey = s.Server.Write(t, s.Dir, "server")
	s.Client = s.CA.Client(t, ClientOptions{CommonName: "client", URIs: []string{"spiffe://test/client"}, DNSNames: []string{"client.test"}})
	s.ClientCert, s.ClientKey = s.Client.Write(t, s.Dir, "client")
	return s
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
