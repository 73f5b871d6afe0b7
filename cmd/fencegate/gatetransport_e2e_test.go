package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/fencegate/fencegate/internal/certs/certstest"
)

// TestGateMutualTLSUnixUpstreamAndReload serves the gate over mutual TLS
// in front of an HTTP service on a Unix socket, with rules from a file: a
// client with a certificate writes over HTTP/2 (ALPN) and HTTP/1.1; one
// without gets no connection and the service sees nothing; SIGHUP makes a
// changed rule take effect without a restart, and a rules file that does
// not parse is refused with a log line naming it while the rules in force
// stay and the process goes on.
func TestGateMutualTLSUnixUpstreamAndReload(t *testing.T) {
	sock, ln := listenUnix(t, "svc.sock")
	var mu sync.Mutex
	var seen []string
	svc := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Host+" "+r.Header.Get("Fencing-Token")+" "+string(body))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = svc.Serve(ln) }()
	t.Cleanup(func() { _ = svc.Close() })
	seenNow := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), seen...) }

	set := certstest.New(t)
	rulesFile := filepath.Join(t.TempDir(), "rules")
	if err := os.WriteFile(rulesFile, []byte("PUT /jobs/{id} fence job:{id}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=unix:" + sock,
		"FENCEGATE_RULES_FILE=" + rulesFile,
		"FENCEGATE_PROXY_TLS_CERT=" + set.ServerCert, "FENCEGATE_PROXY_TLS_KEY=" + set.ServerKey,
		"FENCEGATE_PROXY_TLS_CLIENT_CA=" + set.CAFile, "FENCEGATE_TLS_WATCH=0"}, "api", "gate")

	roots := x509.NewCertPool()
	roots.AddCert(set.CA.Cert)
	clientCert, err := tls.X509KeyPair(set.Client.CertPEM, set.Client.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	client := func(h2 bool, cert bool) *http.Client {
		cfg := &tls.Config{RootCAs: roots, ServerName: "localhost"}
		if cert {
			cfg.Certificates = []tls.Certificate{clientCert}
		}
		tr := &http.Transport{TLSClientConfig: cfg, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP1(!h2)
		tr.Protocols.SetHTTP2(h2)
		return &http.Client{Transport: tr}
	}
	gate := "https://" + p.addr["gate"]
	put := func(c *http.Client, path, tok, body string) (*http.Response, error) {
		req, _ := http.NewRequest("PUT", gate+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Fencing-Token", tok)
		}
		resp, err := c.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}

	st, l, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"w"}`)
	if st != 200 {
		t.Fatalf("acquire: %d %v", st, l)
	}
	tok := strconv.FormatInt(token(t, l), 10)
	for _, h2 := range []bool{true, false} {
		resp, err := put(client(h2, true), "/jobs/1", tok, "h2="+strconv.FormatBool(h2))
		if err != nil || resp.StatusCode != http.StatusNoContent || resp.ProtoMajor != map[bool]int{true: 2, false: 1}[h2] {
			t.Fatalf("write over mutual TLS (h2 %v): %v %+v", h2, err, resp)
		}
	}
	if _, err := put(client(true, false), "/jobs/1", tok, "no certificate"); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	want := []string{"PUT /jobs/1 " + p.addr["gate"] + " " + tok + " h2=true", "PUT /jobs/1 " + p.addr["gate"] + " " + tok + " h2=false"}
	if got := seenNow(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the service saw %q, want %q (the client's Host kept on a Unix socket)", got, want)
	}

	// A rule changed on disk takes effect at SIGHUP.
	c := client(false, true)
	if resp, err := put(c, "/jobs/1", "", "no token"); err != nil || resp.StatusCode != http.StatusPreconditionRequired {
		t.Fatalf("before the reload, a write without a token: %v %+v", err, resp)
	}
	if err := os.WriteFile(rulesFile, []byte("PUT /jobs/{id} deny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitLog("write gate rules reloaded", 1)
	if resp, err := put(c, "/jobs/1", tok, "denied"); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("after the reload, a write under the deny rule: %v %+v", err, resp)
	}
	// A file that does not parse is refused, named in the log; the rules
	// in force stay and the process goes on.
	if err := os.WriteFile(rulesFile, []byte("PUT /jobs/{id} fence\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitLog("FENCEGATE_RULES_FILE "+rulesFile, 2) // registered, then named in the refusal
	p.waitLog("reload refused", 1)
	if resp, err := put(c, "/jobs/1", tok, "still denied"); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("after a refused reload, a write: %v %+v", err, resp)
	}
	// An empty file (one caught while it is rewritten) is refused too: it
	// would drop every rule and turn on the Fencing-Resource fallback.
	for i, empty := range []string{"", "# rules\n\n"} {
		if err := os.WriteFile(rulesFile, []byte(empty), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		p.waitLog("holds no rules while 1 are in force", i+1)
		req, _ := http.NewRequest("PUT", gate+"/jobs/1", strings.NewReader("empty rules"))
		req.Header.Set("Fencing-Token", tok)
		req.Header.Set("Fencing-Resource", "scratch")
		if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("after an empty rules file (%q), a write: %v %+v", empty, err, resp)
		} else {
			resp.Body.Close()
		}
	}
	if got := seenNow(); len(got) != 2 {
		t.Fatalf("the service saw %q after the reloads", got)
	}
}
