package main

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/certs/certstest"
)

// TestGateTLSToHTTPUpstream serves the gate over mutual TLS in front of an
// http:// service (on Linux, its HTTP/1.1 connections on the event loops
// through the TLS relay; with FENCEGATE_TLS_LOOPS=false on net/http
// alone): writes over HTTP/1.1 and HTTP/2 reach the service saying https
// and the client's address; SIGHUP with a new certificate on disk gives
// new connections the new one while a connection opened before goes on;
// SIGTERM ends the process with that connection still open.
func TestGateTLSToHTTPUpstream(t *testing.T) {
	for _, loops := range []string{"true", "false"} {
		t.Run("FENCEGATE_TLS_LOOPS="+loops, func(t *testing.T) {
			var mu sync.Mutex
			var seen []string
			svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen = append(seen, r.Proto+" "+r.Header.Get("X-Forwarded-Proto")+" "+r.Header.Get("X-Forwarded-For"))
				mu.Unlock()
				w.WriteHeader(http.StatusNoContent)
			}))
			defer svc.Close()
			set := certstest.New(t)
			p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + svc.URL,
				"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}",
				"FENCEGATE_PROXY_TLS_CERT=" + set.ServerCert, "FENCEGATE_PROXY_TLS_KEY=" + set.ServerKey,
				"FENCEGATE_PROXY_TLS_CLIENT_CA=" + set.CAFile, "FENCEGATE_TLS_WATCH=0", "FENCEGATE_TLS_LOOPS=" + loops}, "api", "gate")
			st, l, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"w"}`)
			if st != 200 {
				t.Fatalf("acquire: %d %v", st, l)
			}
			tok := strconv.FormatInt(token(t, l), 10)
			put := "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: " + tok + "\r\nContent-Length: 1\r\n\r\nx"
			cfg := &tls.Config{RootCAs: set.CA.Pool(), Certificates: []tls.Certificate{set.Client.TLS(t)}, NextProtos: []string{"http/1.1"}}

			c1, err := tls.Dial("tcp", p.addr["gate"], cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c1.Close()
			br := bufio.NewReader(c1)
			write := func(what string) {
				t.Helper()
				if _, err := io.WriteString(c1, put); err != nil {
					t.Fatal(err)
				}
				_ = c1.SetReadDeadline(time.Now().Add(30 * time.Second))
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					t.Fatalf("%s: %d", what, resp.StatusCode)
				}
			}
			write("HTTP/1.1 write")
			if c1.ConnectionState().PeerCertificates[0].SerialNumber.Cmp(set.Server.Cert.SerialNumber) != 0 {
				t.Fatal("not the first certificate")
			}

			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: set.CA.Pool(), Certificates: []tls.Certificate{set.Client.TLS(t)}},
				Protocols: new(http.Protocols)}
			tr.Protocols.SetHTTP2(true)
			defer tr.CloseIdleConnections()
			req, _ := http.NewRequest("PUT", "https://"+p.addr["gate"]+"/jobs/1", strings.NewReader("x"))
			req.Header.Set("Fencing-Token", tok)
			resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
			if err != nil || resp.StatusCode != http.StatusNoContent || resp.ProtoMajor != 2 {
				t.Fatalf("HTTP/2 write: %v %+v", err, resp)
			}
			resp.Body.Close()

			next := set.CA.Server(t)
			next.Write(t, set.Dir, "server")
			if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			p.waitLog(`"msg":"reloaded"`, 1)
			if serial, _ := servedSerial(t, p.addr["gate"], cfg); serial != next.Cert.SerialNumber.String() {
				t.Fatalf("after SIGHUP: serial %s, want the new certificate's %s", serial, next.Cert.SerialNumber)
			}
			write("the connection opened before the reload")

			mu.Lock()
			got := append([]string(nil), seen...)
			mu.Unlock()
			want := []string{"HTTP/1.1 https 127.0.0.1", "HTTP/1.1 https 127.0.0.1", "HTTP/1.1 https 127.0.0.1"}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("the service saw %q, want %q", got, want)
			}
			if err := p.stop(); err != nil {
				t.Fatalf("exit after SIGTERM: %v\n%s", err, p.logs)
			}
		})
	}
}
