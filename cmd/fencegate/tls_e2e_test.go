package main

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/certs/certstest"
)

// waitLog waits until the process's log holds want n times in all.
func (p *proc) waitLog(want string, n int) {
	p.t.Helper()
	deadline := time.After(30 * time.Second)
	for strings.Count(p.logs.String(), want) < n {
		select {
		case <-p.exited:
			p.t.Fatalf("fencegate exited (%v) while waiting for %q\n%s", p.err, want, p.logs)
		case <-deadline:
			p.t.Fatalf("no %q in the log (%d times wanted)\n%s", want, n, p.logs)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// servedSerial connects to addr trusting ca and returns the serial number
// of the certificate the server presents, and the ALPN protocol agreed.
func servedSerial(t *testing.T, addr string, cfg *tls.Config) (string, string) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := c.ConnectionState()
	return st.PeerCertificates[0].SerialNumber.String(), st.NegotiatedProtocol
}

// TestAPIOverMutualTLS runs the lease API with TLS and a client CA: the
// CLI, fencegate run and fencegate health reach it with the CA and a client
// certificate; without a certificate nothing is done; HTTP/2 comes by ALPN;
// SIGHUP rotates the certificate for new connections, refuses a pair that
// does not load (saying which), and never stops the process.
func TestAPIOverMutualTLS(t *testing.T) {
	set := certstest.New(t)
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:",
		"FENCEGATE_API_TLS_CERT=" + set.ServerCert, "FENCEGATE_API_TLS_KEY=" + set.ServerKey,
		"FENCEGATE_API_TLS_CLIENT_CA=" + set.CAFile, "FENCEGATE_TLS_WATCH=0"}, "api")
	api := "https://" + p.addr["api"]
	clientEnv := []string{"FENCEGATE_API_URL=" + api, "FENCEGATE_API_CA_FILE=" + set.CAFile,
		"FENCEGATE_API_CLIENT_CERT=" + set.ClientCert, "FENCEGATE_API_CLIENT_KEY=" + set.ClientKey}

	r := fg(t, clientEnv, "", "lease", "acquire", "job:tls", "--owner", "w1")
	if r.code != 0 {
		t.Fatalf("acquire over mutual TLS: exit %d, %s", r.code, r.stderr)
	}
	if lease := r.jsonLine(t); lease["owner"] != "w1" {
		t.Fatalf("acquire: %v", lease)
	}

	// Without a client certificate, or trusting no private CA: nothing done.
	noCert := fg(t, clientEnv[:2], "", "lease", "acquire", "job:nocert", "--owner", "w1")
	noCA := fg(t, []string{clientEnv[0], clientEnv[2], clientEnv[3]}, "", "lease", "acquire", "job:noca", "--owner", "w1")
	plain := fg(t, append([]string{"FENCEGATE_API_URL=http://" + p.addr["api"]}, clientEnv[1:]...), "", "lease", "acquire", "job:plain", "--owner", "w1")
	if plain.code != exitUsage || !strings.Contains(plain.stderr, "https://") {
		t.Errorf("cleartext to the HTTPS API: exit %d %q, want 2 and a hint", plain.code, plain.stderr)
	}
	for name, r := range map[string]cliResult{"no client certificate": noCert, "no private CA": noCA} {
		if r.code != exitUnavailable {
			t.Errorf("%s: acquire exited %d, want %d (unavailable): %s %s", name, r.code, exitUnavailable, r.stdout, r.stderr)
		}
	}
	r = fg(t, clientEnv, "", "lease", "list")
	if r.code != 0 {
		t.Fatalf("list: %d %s", r.code, r.stderr)
	}
	if got := r.stdout; !strings.Contains(got, "job:tls") || strings.Contains(got, "job:nocert") || strings.Contains(got, "job:noca") || strings.Contains(got, "job:plain") {
		t.Fatalf("live leases %s: want job:tls only", got)
	}
	// A wrong client setting is a usage error naming the variables.
	if r := fg(t, clientEnv[:3], "", "lease", "status", "job:tls"); r.code != 2 || !strings.Contains(r.stderr, "FENCEGATE_API_CLIENT_KEY") {
		t.Errorf("client certificate without its key: exit %d, %q", r.code, r.stderr)
	}

	// fencegate run, and the command it runs, reach the API the same way.
	r = fg(t, append(clientEnv, "PATH=/usr/bin:/bin"), "", "run", "--resource", "job:run", "--ttl", "5s", "--", "sh", "-c", `test -n "$FENCING_TOKEN" && echo "token=$FENCING_TOKEN"`)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "token=") {
		t.Fatalf("run over mutual TLS: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// health: the server verified by the pin on its own certificate file
	// (no CA file), or by the CA; without a client certificate, not ready.
	healthEnv := []string{"FENCEGATE_API_ADDR=" + p.addr["api"], "FENCEGATE_API_TLS_CERT=" + set.ServerCert}
	if r := fg(t, append(healthEnv, clientEnv[2:]...), "", "health"); r.code != 0 || r.stdout != "ready\n" {
		t.Errorf("health pinned on the server's certificate: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := fg(t, append(healthEnv, clientEnv[1:]...), "", "health"); r.code != 0 {
		t.Errorf("health with the CA: exit %d, %q", r.code, r.stderr)
	}
	if r := fg(t, healthEnv, "", "health"); r.code != 1 {
		t.Errorf("health without a client certificate on a mutual-TLS API: exit %d, want 1", r.code)
	}

	// HTTP/2 by ALPN, through the Go HTTP client.
	clientPair := set.Client.TLS(t)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: set.CA.Pool(), Certificates: []tls.Certificate{clientPair}}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(api + "/v1/leases/job:tls")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Proto != "HTTP/2.0" || resp.StatusCode != 200 || !strings.Contains(string(body), `"owner":"w1"`) {
		t.Fatalf("status over HTTP/2: %s %d %s", resp.Proto, resp.StatusCode, body)
	}

	// Rotation on SIGHUP: new connections get the new certificate.
	dialCfg := &tls.Config{RootCAs: set.CA.Pool(), Certificates: []tls.Certificate{clientPair}, NextProtos: []string{"h2", "http/1.1"}}
	if serial, proto := servedSerial(t, p.addr["api"], dialCfg); serial != set.Server.Cert.SerialNumber.String() || proto != "h2" {
		t.Fatalf("before rotation: serial %s proto %q", serial, proto)
	}
	next := set.CA.Server(t)
	next.Write(t, set.Dir, "server")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitLog(`"msg":"reloaded"`, 1)
	if serial, _ := servedSerial(t, p.addr["api"], dialCfg); serial != next.Cert.SerialNumber.String() {
		t.Fatalf("after SIGHUP: serial %s, want the new certificate's %s", serial, next.Cert.SerialNumber)
	}
	// A key that does not match: refused, named in the log, the pair in
	// force stays, the process serves on.
	certstest.WriteFile(t, set.ServerKey, set.Client.KeyPEM)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitLog(`"msg":"reload refused: the configuration in force stays"`, 1)
	if !strings.Contains(p.logs.String(), set.ServerCert) {
		t.Errorf("the refusal does not name the file %s\n%s", set.ServerCert, p.logs)
	}
	if serial, _ := servedSerial(t, p.addr["api"], dialCfg); serial != next.Cert.SerialNumber.String() {
		t.Fatalf("after a refused reload: serial %s, want the one in force %s", serial, next.Cert.SerialNumber)
	}
	if r := fg(t, clientEnv, "", "lease", "status", "job:tls"); r.code != 0 {
		t.Fatalf("status after the refused reload: %d %s", r.code, r.stderr)
	}
	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.logs)
	}
}

// TestSIGHUPWithoutTLSDoesNotStop: a SIGHUP, with nothing to reload, is
// logged and the process keeps serving (it used to exit 129).
func TestSIGHUPWithoutTLSDoesNotStop(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	for i := 1; i <= 2; i++ {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		p.waitLog(`"msg":"SIGHUP: reloading"`, i)
	}
	if st, _, _ := call(t, "GET", p.url("api", "/livez"), nil, ""); st != 200 {
		t.Fatalf("livez after SIGHUP: %d", st)
	}
	if err := p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

// TestTLSStartupErrors: a pair that does not load, half a pair, or a client
// CA bundle that does not load stops start-up with an error naming the
// variables at fault, and check says the same.
func TestTLSStartupErrors(t *testing.T) {
	set := certstest.New(t)
	gate := []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:1", "FENCEGATE_PROXY_ADDR=127.0.0.1:0"}
	for _, tc := range []struct {
		env     []string
		want    []string
		notWant string
	}{
		{[]string{"FENCEGATE_API_TLS_CERT=" + set.ServerCert}, []string{"FENCEGATE_API_TLS_CERT", "FENCEGATE_API_TLS_KEY"}, ""},
		{[]string{"FENCEGATE_API_TLS_KEY=" + set.ServerKey}, []string{"FENCEGATE_API_TLS_CERT", "FENCEGATE_API_TLS_KEY"}, ""},
		{[]string{"FENCEGATE_API_TLS_CERT=" + set.ServerCert, "FENCEGATE_API_TLS_KEY=" + set.ClientKey}, []string{"FENCEGATE_API_TLS_CERT and FENCEGATE_API_TLS_KEY: ", set.ServerCert, set.ClientKey}, ""},
		{[]string{"FENCEGATE_API_TLS_CERT=" + set.ServerCert, "FENCEGATE_API_TLS_KEY=" + set.ServerKey, "FENCEGATE_API_TLS_CLIENT_CA=" + set.ServerKey},
			[]string{"FENCEGATE_API_TLS_CLIENT_CA: CA bundle " + set.ServerKey + " holds no PEM certificate"}, "FENCEGATE_API_TLS_CERT"},
		{append([]string{"FENCEGATE_PROXY_TLS_CERT=" + set.ServerCert, "FENCEGATE_PROXY_TLS_KEY=" + set.ServerKey, "FENCEGATE_PROXY_TLS_CLIENT_CA=" + set.ServerKey}, gate...),
			[]string{"FENCEGATE_PROXY_TLS_CLIENT_CA: CA bundle " + set.ServerKey + " holds no PEM certificate"}, "FENCEGATE_PROXY_TLS_CERT"},
		{[]string{"FENCEGATE_PROXY_TLS_CERT=" + set.ServerCert}, []string{"FENCEGATE_PROXY_TLS_CERT", "FENCEGATE_PROXY_TLS_KEY"}, ""},
	} {
		r := fg(t, append([]string{"FENCEGATE_STORE=memory:", "FENCEGATE_API_ADDR=127.0.0.1:0"}, tc.env...), "", "serve")
		c := fg(t, append([]string{"FENCEGATE_STORE=memory:"}, tc.env...), "", "check")
		if r.code == 0 {
			t.Errorf("%v: started", tc.env)
			continue
		}
		if c.code != 2 {
			t.Errorf("%v: check exited %d, want 2 (%s)", tc.env, c.code, c.stdout)
		}
		for cmd, out := range map[string]string{"serve": r.stderr, "check": c.stdout + c.stderr} {
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("%s %v: error %q does not name %q", cmd, tc.env, out, w)
				}
			}
			if tc.notWant != "" && strings.Contains(out, tc.notWant) {
				t.Errorf("%s %v: error %q names %q, not at fault", cmd, tc.env, out, tc.notWant)
			}
		}
	}
}
