package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/certs"
	"github.com/fencegate/fencegate/internal/certs/certstest"
)

// serveTLS accepts TLS connections on loopback with cfg; each connection
// completes its handshake and echoes what it reads. It returns the address.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() != nil {
					return
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func dial(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	// A server that refuses the client's certificate says so after the
	// client's side of a TLS 1.3 handshake is done: a round trip shows it.
	if _, err := c.Write([]byte("x")); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func peerSerial(c *tls.Conn) string {
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func TestServesPairAndALPN(t *testing.T) {
	set := certstest.New(t)
	src, err := certs.New(certs.Files{CertFile: set.ServerCert, KeyFile: set.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, src.TLSConfig())
	for _, proto := range []string{"h2", "http/1.1"} {
		c, err := dial(addr, &tls.Config{RootCAs: set.CA.Pool(), NextProtos: []string{proto}})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != proto {
			t.Errorf("ALPN: negotiated %q, want %q", got, proto)
		}
		if peerSerial(c) != set.Server.Cert.SerialNumber.String() {
			t.Error("served another certificate than the file's")
		}
		c.Close()
	}
	if _, err := dial(addr, &tls.Config{RootCAs: set.CA.Pool(), MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10}); err == nil {
		t.Error("a TLS 1.1 client was served; want TLS 1.2 or later only")
	}
	if _, err := dial(addr, &tls.Config{RootCAs: certstest.NewCA(t, "other").Pool()}); err == nil {
		t.Error("a client trusting another CA accepted the server")
	}
}

func TestReloadRotatesForNewConnectionsOnly(t *testing.T) {
	set := certstest.New(t)
	src, err := certs.New(certs.Files{CertFile: set.ServerCert, KeyFile: set.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, src.TLSConfig())
	client := &tls.Config{RootCAs: set.CA.Pool()}
	old, err := dial(addr, client)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()

	next := set.CA.Server(t)
	next.Write(t, set.Dir, "server")
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	fresh, err := dial(addr, client)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if got, want := peerSerial(fresh), next.Cert.SerialNumber.String(); got != want {
		t.Errorf("new connection after reload: serial %s, want the new %s", got, want)
	}
	// The open connection still works, with its certificate.
	if _, err := old.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(old, make([]byte, 1)); err != nil {
		t.Fatalf("open connection broken by the reload: %v", err)
	}
	if peerSerial(old) != set.Server.Cert.SerialNumber.String() {
		t.Error("open connection's certificate changed")
	}
}

// TestHandshakesShareTheConfigurationInForce: a handshake is handed the
// configuration of the pair in force without allocating one (a listener
// with many connections keeps one per pair, not one per connection), and
// a reload hands later handshakes the new pair's.
func TestHandshakesShareTheConfigurationInForce(t *testing.T) {
	set := certstest.New(t)
	src, err := certs.New(certs.Files{CertFile: set.ServerCert, KeyFile: set.ServerKey, ClientCAFile: set.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	base, hello := src.TLSConfig(), &tls.ClientHelloInfo{}
	forClient := func() *tls.Config {
		c, err := base.GetConfigForClient(hello)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if n := testing.AllocsPerRun(100, func() { forClient() }); n != 0 {
		t.Errorf("a handshake's configuration allocated %v times; want none", n)
	}
	c := forClient()
	if got := c.Certificates[0].Leaf.SerialNumber.String(); got != set.Server.Cert.SerialNumber.String() {
		t.Errorf("handshake configuration serves serial %s, want the file's", got)
	}
	if c.ClientAuth != tls.RequireAndVerifyClientCert || c.ClientCAs == nil || c.MinVersion != tls.VersionTLS12 {
		t.Errorf("handshake configuration: client auth %v, client CAs %v, min version %x", c.ClientAuth, c.ClientCAs != nil, c.MinVersion)
	}
	next := set.CA.Server(t)
	next.Write(t, set.Dir, "server")
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := forClient().Certificates[0].Leaf.SerialNumber.String(); got != next.Cert.SerialNumber.String() {
		t.Errorf("after reload the handshake configuration serves serial %s, want the new %s", got, next.Cert.SerialNumber)
	}
	if forClient().Certificates[0].Leaf.SerialNumber.String() == set.Server.Cert.SerialNumber.String() {
		t.Error("the old pair is still handed out after reload")
	}
}

func TestReloadOfBadPairKeepsTheOneInForce(t *testing.T) {
	set := certstest.New(t)
	src, err := certs.New(certs.Files{CertFile: set.ServerCert, KeyFile: set.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, src.TLSConfig())
	other := set.CA.Server(t)
	cases := map[string]func(){
		"key of another certificate": func() { certstest.WriteFile(t, set.ServerKey, other.KeyPEM) },
		"truncated certificate":      func() { certstest.WriteFile(t, set.ServerCert, set.Server.CertPEM[:40]) },
		"missing key":                func() { os.Remove(set.ServerKey) },
	}
	for name, breakIt := range cases {
		t.Run(name, func(t *testing.T) {
			set.Server.Write(t, set.Dir, "server")
			breakIt()
			err := src.Reload()
			if err == nil {
				t.Fatal("Reload of a bad pair succeeded")
			}
			if !strings.Contains(err.Error(), set.ServerCert) {
				t.Errorf("error %q does not name the file", err)
			}
			c, err := dial(addr, &tls.Config{RootCAs: set.CA.Pool()})
			if err != nil {
				t.Fatalf("after a failed reload: %v", err)
			}
			defer c.Close()
			if peerSerial(c) != set.Server.Cert.SerialNumber.String() {
				t.Error("the pair in force changed after a failed reload")
			}
		})
	}
}

func TestNewRefusesBadFiles(t *testing.T) {
	set := certstest.New(t)
	if _, err := certs.New(certs.Files{CertFile: set.ServerCert}); err == nil {
		t.Error("New without a key file succeeded")
	}
	_, err := certs.New(certs.Files{CertFile: set.ServerCert, KeyFile: set.ClientKey, ClientCAFile: set.CAFile})
	if err == nil {
		t.Error("New with a mismatched key succeeded")
	} else if errors.As(err, new(*certs.ClientCAError)) {
		t.Errorf("New with a mismatched key blames the client CA bundle: %v", err)
	}
	_, err = certs.New(certs.Files{CertFile: set.ServerCert, KeyFile: set.ServerKey, ClientCAFile: set.ServerKey})
	if err == nil || !strings.Contains(err.Error(), set.ServerKey) || !errors.As(err, new(*certs.ClientCAError)) {
		t.Errorf("New with a client CA bundle holding no certificate: %v, want a ClientCAError naming the file", err)
	}
}

func TestMutualTLS(t *testing.T) {
	set := certstest.New(t)
	src, err := certs.New(certs.Files{CertFile: set.ServerCert, KeyFile: set.ServerKey, ClientCAFile: set.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	if !src.MutualTLS() {
		t.Fatal("MutualTLS() = false with a client CA")
	}
	addr := serveTLS(t, src.TLSConfig())
	good, err := certs.ClientConfig(certs.ClientFiles{CAFile: set.CAFile, CertFile: set.ClientCert, KeyFile: set.ClientKey})
	if err != nil {
		t.Fatal(err)
	}
	// With a session cache: its second connection resumes the first's
	// session, which must not outlive the CA bundle that verified it.
	good.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	for i := range 2 {
		c, err := dial(addr, good)
		if err != nil {
			t.Fatalf("client with a certificate of the CA, connection %d: %v", i, err)
		}
		if resumed := c.ConnectionState().DidResume; resumed != (i == 1) {
			t.Fatalf("connection %d resumed: %v", i, resumed)
		}
		c.Close()
	}

	noCert, _ := certs.ClientConfig(certs.ClientFiles{CAFile: set.CAFile})
	if _, err := dial(addr, noCert); err == nil {
		t.Error("client without a certificate was served")
	}
	rogue := certstest.NewCA(t, "rogue").Client(t, certstest.ClientOptions{CommonName: "client", URIs: []string{"spiffe://test/client"}})
	rc, rk := rogue.Write(t, t.TempDir(), "rogue")
	rogueCfg, _ := certs.ClientConfig(certs.ClientFiles{CAFile: set.CAFile, CertFile: rc, KeyFile: rk})
	if _, err := dial(addr, rogueCfg); err == nil {
		t.Error("client with a certificate of another CA was served")
	}

	// The client CA bundle is reloaded with the pair: after trusting only
	// the rogue CA, the rogue client is served and the first one not.
	rogueCA := certstest.NewCA(t, "rogue2")
	r2 := rogueCA.Client(t, certstest.ClientOptions{CommonName: "r2"})
	r2c, r2k := r2.Write(t, t.TempDir(), "r2")
	certstest.WriteFile(t, set.CAFile, rogueCA.PEM)
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	r2Cfg, _ := certs.ClientConfig(certs.ClientFiles{CAFile: set.CAFile, CertFile: r2c, KeyFile: r2k})
	r2Cfg.RootCAs = set.CA.Pool()
	if c, err := dial(addr, r2Cfg); err != nil {
		t.Errorf("after reloading the client CA bundle, its client: %v", err)
	} else {
		c.Close()
	}
	good.RootCAs = set.CA.Pool()
	if c, err := dial(addr, good); err == nil {
		t.Errorf("after reloading the client CA bundle, a client of the old CA was still served (its session resumed: %v)", c.ConnectionState().DidResume)
	}
}

func TestWatchReloadsChangedFiles(t *testing.T) {
	set := certstest.New(t)
	src, err := certs.New(certs.Files{CertFile: set.ServerCert, KeyFile: set.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan error, 16)
	go src.Watch(ctx, 5*time.Millisecond, func(err error) { results <- err })

	// A bad key first: reported, the pair in force stays.
	other := set.CA.Server(t)
	certstest.WriteFile(t, set.ServerKey, other.KeyPEM)
	if err := waitResult(t, results); err == nil {
		t.Fatal("Watch reloaded a mismatched pair without error")
	}
	if src.Certificate().Leaf.SerialNumber.Cmp(set.Server.Cert.SerialNumber) != 0 {
		t.Fatal("a failed reload replaced the pair in force")
	}
	// Then the matching certificate: reloaded.
	certstest.WriteFile(t, set.ServerCert, other.CertPEM)
	if err := waitResult(t, results); err != nil {
		t.Fatalf("Watch reload of a good pair: %v", err)
	}
	if src.Certificate().Leaf.SerialNumber.Cmp(other.Cert.SerialNumber) != 0 {
		t.Fatal("Watch did not put the new pair in force")
	}
}

func waitResult(t *testing.T, results <-chan error) error {
	t.Helper()
	select {
	case err := <-results:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Watch did not notice the change")
		return nil
	}
}

func TestClientConfig(t *testing.T) {
	set := certstest.New(t)
	if _, err := certs.ClientConfig(certs.ClientFiles{CertFile: set.ClientCert}); err == nil {
		t.Error("a client certificate without its key was accepted")
	}
	if _, err := certs.ClientConfig(certs.ClientFiles{CAFile: set.ClientKey}); err == nil {
		t.Error("a CA file without a certificate was accepted")
	}
	cfg, err := certs.ClientConfig(certs.ClientFiles{CertFile: set.ClientCert, KeyFile: set.ClientKey})
	if err != nil {
		t.Fatal(err)
	}
	got, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if leaf, _ := x509.ParseCertificate(got.Certificate[0]); leaf.SerialNumber.Cmp(set.Client.Cert.SerialNumber) != 0 {
		t.Fatal("presented another certificate than the file's")
	}
	// Rotated on disk: the next handshake presents the new one; a broken
	// pair keeps the last good one.
	next := set.CA.Client(t, certstest.ClientOptions{CommonName: "next"})
	next.Write(t, set.Dir, "client")
	got, _ = cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if leaf, _ := x509.ParseCertificate(got.Certificate[0]); leaf.SerialNumber.Cmp(next.Cert.SerialNumber) != 0 {
		t.Fatal("a rotated client certificate was not picked up")
	}
	certstest.WriteFile(t, set.ClientKey, set.Server.KeyPEM)
	got, err = cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if leaf, _ := x509.ParseCertificate(got.Certificate[0]); leaf.SerialNumber.Cmp(next.Cert.SerialNumber) != 0 {
		t.Fatal("a broken client pair replaced the last good one")
	}
}
