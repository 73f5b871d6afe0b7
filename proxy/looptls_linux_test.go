//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/certs/certstest"
	"github.com/fencegate/fencegate/internal/syncbuf"
)

// tlsLoopEnv is a gate (newEnv's, rules "PUT /jobs/{id} fence job:{id}")
// served over TLS as well, and the client side of that TLS.
type tlsLoopEnv struct {
	*env
	srv    *gateServer // the TLS listener's
	ca     *certstest.CA
	client *tls.Config
	logs   *syncbuf.Buffer // the gate's log lines (JSON)
}

// newTLSLoopEnv serves the gate over TLS with opts (its TLS field set
// here, from server when not nil).
func newTLSLoopEnv(t *testing.T, opts ServerOptions, server *tls.Config) *tlsLoopEnv {
	t.Helper()
	logs := &syncbuf.Buffer{}
	e := newEnv(t, "PUT /jobs/{id} fence job:{id}", func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ca := certstest.NewCA(t, "tls loops CA")
	if server == nil {
		server = &tls.Config{Certificates: []tls.Certificate{ca.Server(t).TLS(t)}}
	}
	opts.TLS = server
	srv := serveGateWith(t, e.gate, opts)
	return &tlsLoopEnv{env: e, srv: srv, ca: ca, logs: logs,
		client: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", NextProtos: []string{"http/1.1"}}}
}

// dial opens a TLS connection to the gate.
func (e *tlsLoopEnv) dial(t *testing.T) *tls.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", e.srv.Listener.Addr().String(), e.client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes raw on c and reads one answer.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, raw string) *http.Response {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// loopClients counts the connections s's event loops serve (-1 without
// loops).
func loopClients(s *Server) int {
	e := s.engine()
	if e == nil {
		return -1
	}
	var n atomic.Int64
	for _, l := range e.loops {
		l.call(func() { n.Add(int64(len(l.clients))) })
	}
	return int(n.Load())
}

// TestTLSLoopsForwardAsTLS: over TLS, a write the loops forward, writes
// they hand to the general engine (a chunked body, HTTP/1.0) and a write
// over HTTP/2 all reach the upstream saying they came over TLS
// (X-Forwarded-Proto https) from the client's address, not the relay's
// socket pair, and the audit log names the client's address. The loops
// serve the HTTP/1.1 connection; with NoTLSLoops they serve none, and
// the upstream sees the same.
func TestTLSLoopsForwardAsTLS(t *testing.T) {
	for _, noLoops := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoTLSLoops=%v", noLoops), func(t *testing.T) {
			e := newTLSLoopEnv(t, ServerOptions{NoTLSLoops: noLoops}, nil)
			tk := tok(e.acquire("job:1", "w", time.Hour).Token)
			c := e.dial(t)
			br := bufio.NewReader(c)
			put := "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: " + tk + "\r\nContent-Length: 2\r\n\r\nhi"
			if r := roundTrip(t, c, br, put); r.StatusCode != http.StatusOK {
				t.Fatalf("loop write: %d", r.StatusCode)
			}
			want := 1
			if noLoops {
				want = -1
			}
			if n := loopClients(e.srv.srv); n != want {
				t.Errorf("the loops serve %d connections, want %d", n, want)
			}
			chunked := "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: " + tk + "\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
			if r := roundTrip(t, c, br, chunked); r.StatusCode != http.StatusOK {
				t.Fatalf("chunked write: %d", r.StatusCode)
			}
			c2 := e.dial(t)
			old := "PUT /jobs/1 HTTP/1.0\r\nHost: gate\r\nFencing-Token: " + tk + "\r\nContent-Length: 2\r\n\r\nhi"
			if r := roundTrip(t, c2, bufio.NewReader(c2), old); r.StatusCode != http.StatusOK {
				t.Fatalf("HTTP/1.0 write: %d", r.StatusCode)
			}
			cfg := e.client.Clone()
			cfg.NextProtos = nil
			tr := &http.Transport{TLSClientConfig: cfg, Protocols: new(http.Protocols)}
			tr.Protocols.SetHTTP2(true)
			defer tr.CloseIdleConnections()
			resp, err := doReq(&http.Client{Transport: tr, Timeout: 20 * time.Second}, "https://"+e.srv.Listener.Addr().String(), "PUT", "/jobs/1", "hi", HeaderToken, tk)
			if err != nil || resp.Status != http.StatusOK {
				t.Fatalf("HTTP/2 write: %v %+v", err, resp)
			}
			got := e.up.requests()
			if len(got) != 4 {
				t.Fatalf("upstream got %d requests, want 4", len(got))
			}
			for i, r := range got {
				if p := r.Header.Get("X-Forwarded-Proto"); p != "https" {
					t.Errorf("request %d: X-Forwarded-Proto %q, want https", i, p)
				}
				if f := r.Header.Get("X-Forwarded-For"); f != "127.0.0.1" {
					t.Errorf("request %d: X-Forwarded-For %q, want 127.0.0.1", i, f)
				}
			}
			waitFor(t, "four audit lines", func() bool { return strings.Count(e.logs.String(), `"client":`) >= 4 })
			for _, line := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
				if strings.Contains(line, `"client":`) && !strings.Contains(line, `"client":"127.0.0.1:`) {
					t.Errorf("a log line without the client's address: %s", line)
				}
			}
		})
	}
}

// openFDs counts the process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestTLSLoopsEndEverything: every way a TLS connection on the loops
// ends (the client's close, its reset, the gate's close after an answer,
// the idle ones at Shutdown, handshakes that never come at Shutdown)
// closes its pump and its descriptors and ends its goroutines: after
// Shutdown, the goroutines and descriptors are those of before.
func TestTLSLoopsEndEverything(t *testing.T) {
	e := newTLSLoopEnv(t, ServerOptions{}, nil)
	tk := tok(e.acquire("job:1", "w", time.Hour).Token)
	// A request through the cleartext gate first, so the upstream's and
	// the transports' goroutines are counted in the baseline.
	e.do("PUT", "/jobs/1", "x", HeaderToken, tk)
	runtime.GC()
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)

	const per = 10
	addr := e.srv.Listener.Addr().String()
	put := "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: " + tk + "\r\nContent-Length: 1\r\n\r\nx"
	var idle []net.Conn
	for i := range 4 * per {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c := tls.Client(raw, e.client)
		br := bufio.NewReader(c)
		switch i % 4 {
		case 0: // the client closes
			roundTrip(t, c, br, put)
			c.Close()
		case 1: // the client resets
			roundTrip(t, c, br, put)
			_ = raw.(*net.TCPConn).SetLinger(0)
			raw.Close()
		case 2: // the gate closes after its answer
			r := roundTrip(t, c, br, strings.Replace(put, "Host: gate", "Host: gate\r\nConnection: close", 1))
			if !r.Close {
				t.Errorf("answer without Connection: close")
			}
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Errorf("the gate did not close after Connection: close")
			}
			c.Close()
		case 3: // idle until Shutdown
			roundTrip(t, c, br, put)
			idle = append(idle, c)
		}
	}
	var stalled []net.Conn // TCP connections that never start their handshake
	for range per {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, raw)
	}
	waitFor(t, "the loops to hold the idle connections only", func() bool { return loopClients(e.srv.srv) == per })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.srv.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for _, c := range append(idle, stalled...) {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("a connection still open after Shutdown: %v", err)
		}
		c.Close()
	}
	waitFor(t, "the goroutines of before", func() bool { return runtime.NumGoroutine() <= goroutines })
	waitFor(t, "the descriptors of before", func() bool { return openFDs(t) <= fds })
}

// TestTLSLoopsCloseWhileBusy: Close, with connections mid-request, idle,
// mid-handshake and a client that reads nothing of a large answer, ends
// every pump: the goroutines and descriptors are those of before.
func TestTLSLoopsCloseWhileBusy(t *testing.T) {
	e := newTLSLoopEnv(t, ServerOptions{}, nil)
	big := bytes.Repeat([]byte("x"), 8<<20)
	e.up.handle = func(w http.ResponseWriter, r *http.Request, _ received) bool {
		if r.URL.Path == "/big" {
			_, _ = w.Write(big)
			return true
		}
		return false
	}
	e.do("GET", "/big", "")
	runtime.GC()
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)

	addr := e.srv.Listener.Addr().String()
	var conns []net.Conn
	for range 5 {
		c := e.dial(t) // idle after its handshake
		conns = append(conns, c)
		c = e.dial(t) // asks for 8 MiB and reads none of it
		if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: gate\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		raw, err := net.Dial("tcp", addr) // never starts its handshake
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, raw)
	}
	waitFor(t, "the large answers to be under way", func() bool { return loopClients(e.srv.srv) == 10 })
	e.srv.Close()
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, "the goroutines of before", func() bool { return runtime.NumGoroutine() <= goroutines })
	waitFor(t, "the descriptors of before", func() bool { return openFDs(t) <= fds })
}

// TestTLSLoopsSlowReader: a client that stops reading a large answer
// makes the gate buffer no more than its sockets' buffers: the upstream's
// write stalls far short of the answer, which arrives whole once the
// client reads.
func TestTLSLoopsSlowReader(t *testing.T) {
	const size = 64 << 20
	var written atomic.Int64
	e := newTLSLoopEnv(t, ServerOptions{}, nil)
	e.up.handle = func(w http.ResponseWriter, r *http.Request, _ received) bool {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		chunk := make([]byte, 64<<10)
		for written.Load() < size {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return true
			}
		}
		return true
	}
	c := e.dial(t)
	if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: gate\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// Wait until the upstream's writes stall (no progress for a while).
	last := int64(-1)
	for range 200 {
		time.Sleep(250 * time.Millisecond)
		n := written.Load()
		if n == last && n > 0 {
			break
		}
		last = n
	}
	if n := written.Load(); n >= size/2 {
		t.Fatalf("the upstream wrote %d of %d bytes to a client that reads nothing: the gate buffers without bound", n, size)
	}
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || n != size {
		t.Fatalf("read %d of %d bytes: %v", n, size, err)
	}
}

// TestTLSLoopsConnectionCap: a connection beyond MaxConns is closed
// before its handshake (connections whose handshake has not come yet
// hold their places), and one is served again once a place is free.
func TestTLSLoopsConnectionCap(t *testing.T) {
	e := newTLSLoopEnv(t, ServerOptions{MaxConns: 2}, nil)
	addr := e.srv.Listener.Addr().String()
	var stalled []net.Conn
	for range 2 {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		stalled = append(stalled, raw)
	}
	waitFor(t, "both places taken", func() bool { return e.srv.srv.limit.Active() == 2 })
	if c, err := tls.Dial("tcp", addr, e.client); err == nil {
		c.Close()
		t.Errorf("a handshake beyond MaxConns succeeded")
	}
	for _, raw := range stalled {
		raw.Close()
	}
	waitFor(t, "the places free", func() bool { return e.srv.srv.limit.Active() == 0 })
	c := e.dial(t)
	if r := roundTrip(t, c, bufio.NewReader(c), "GET /x HTTP/1.1\r\nHost: gate\r\n\r\n"); r.StatusCode != http.StatusOK {
		t.Errorf("after the places freed: %d", r.StatusCode)
	}
	c.Close()
	waitFor(t, "its place free", func() bool { return e.srv.srv.limit.Active() == 0 })
}

// TestTLSLoopsTimeouts: a handshake that never comes is closed after the
// header timeout (a slow loris on the handshake is bounded), and an idle
// connection after the idle timeout.
func TestTLSLoopsTimeouts(t *testing.T) {
	e := newTLSLoopEnv(t, ServerOptions{HeaderTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}, nil)
	addr := e.srv.Listener.Addr().String()
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte{0x16, 0x03, 0x01}); err != nil { // the start of a ClientHello, and no more
		t.Fatal(err)
	}
	_ = raw.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := raw.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("a stalled handshake: %v, want the gate's close", err)
	}
	c := e.dial(t)
	roundTrip(t, c, bufio.NewReader(c), "GET /x HTTP/1.1\r\nHost: gate\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("an idle connection: %v, want the gate's close", err)
	}
	waitFor(t, "the places free", func() bool { return e.srv.srv.limit.Active() == 0 })
}

// TestTLSLoopsMutualTLSAndReload: with mutual TLS, a client without a
// certificate is refused at the handshake and one with a certificate is
// served by the loops; a certificate changed while serving is presented
// to new handshakes, and a connection opened before goes on.
func TestTLSLoopsMutualTLSAndReload(t *testing.T) {
	ca := certstest.NewCA(t, "mtls CA")
	first, second := ca.Server(t).TLS(t), ca.Server(t).TLS(t)
	var cur atomic.Pointer[tls.Certificate]
	cur.Store(&first)
	server := &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cur.Load(), nil },
		ClientCAs:      ca.Pool(),
		ClientAuth:     tls.RequireAndVerifyClientCert,
	}
	e := newTLSLoopEnv(t, ServerOptions{}, server)
	e.client.RootCAs = ca.Pool()
	addr := e.srv.Listener.Addr().String()

	if c, err := tls.Dial("tcp", addr, e.client); err == nil {
		// TLS 1.3: the refusal arrives with the first read.
		_, _ = io.WriteString(c, "GET /x HTTP/1.1\r\nHost: gate\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("a client without a certificate was served")
		}
		c.Close()
	}
	if n := e.up.count(); n != 0 {
		t.Fatalf("upstream got %d requests from a client without a certificate", n)
	}
	e.client.Certificates = []tls.Certificate{ca.Client(t, certstest.ClientOptions{CommonName: "worker"}).TLS(t)}
	c1 := e.dial(t)
	br1 := bufio.NewReader(c1)
	if r := roundTrip(t, c1, br1, "GET /x HTTP/1.1\r\nHost: gate\r\n\r\n"); r.StatusCode != http.StatusOK {
		t.Fatalf("mutual TLS client: %d", r.StatusCode)
	}
	if n := loopClients(e.srv.srv); n != 1 {
		t.Errorf("the loops serve %d connections, want 1", n)
	}
	if got := c1.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(first.Leaf.SerialNumber) != 0 {
		t.Fatalf("first certificate: serial %v", got)
	}
	cur.Store(&second)
	c2 := e.dial(t)
	if got := c2.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(second.Leaf.SerialNumber) != 0 {
		t.Errorf("after the change: serial %v, want the new certificate's", got)
	}
	if r := roundTrip(t, c1, br1, "GET /x HTTP/1.1\r\nHost: gate\r\n\r\n"); r.StatusCode != http.StatusOK {
		t.Errorf("the connection opened before the change: %d", r.StatusCode)
	}
}

// TestTLSLoopsLargeBodies: bodies of many TLS records cross the pump
// intact both ways: writes the loops buffer and one they hand to the
// general engine to stream, pipelined on one connection, and a large
// answer.
func TestTLSLoopsLargeBodies(t *testing.T) {
	e := newTLSLoopEnv(t, ServerOptions{}, nil)
	answer := make([]byte, 5<<20+17)
	for i := range answer {
		answer[i] = byte(i*7 + i>>11)
	}
	e.up.handle = func(w http.ResponseWriter, r *http.Request, _ received) bool {
		if r.URL.Path == "/big" {
			_, _ = w.Write(answer)
			return true
		}
		return false
	}
	tk := tok(e.acquire("job:1", "w", time.Hour).Token)
	var raw strings.Builder
	var bodies []string
	for i, size := range []int{20 << 10, 3 << 20, 1} {
		b := strings.Repeat(string(rune('a'+i)), size-1) + "!"
		bodies = append(bodies, b)
		fmt.Fprintf(&raw, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: %s\r\nContent-Length: %d\r\n\r\n%s", tk, len(b), b)
	}
	c := e.dial(t)
	br := bufio.NewReader(c)
	go func() { _, _ = io.WriteString(c, raw.String()) }()
	for i := range bodies {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(got) != "applied "+bodies[i] {
			t.Fatalf("write %d: %d, %d bytes back", i, resp.StatusCode, len(got))
		}
	}
	if got := e.up.requests(); len(got) != len(bodies) {
		t.Fatalf("upstream got %d writes", len(got))
	} else {
		for i, r := range got {
			if r.Body != bodies[i] {
				t.Errorf("write %d: upstream got %d bytes, want %d", i, len(r.Body), len(bodies[i]))
			}
		}
	}
	c2 := e.dial(t)
	resp := roundTripBody(t, c2, "GET /big HTTP/1.1\r\nHost: gate\r\n\r\n")
	if !bytes.Equal(resp, answer) {
		t.Errorf("the large answer: %d bytes, not the upstream's %d", len(resp), len(answer))
	}
}

// roundTripBody writes raw on c and returns the answer's body.
func roundTripBody(t *testing.T, c net.Conn, raw string) []byte {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
