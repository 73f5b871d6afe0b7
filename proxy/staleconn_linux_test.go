//go:build linux

package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// closingUpstream is a raw HTTP/1.1 upstream that records every request
// body it receives, and whose idle connections the test closes (FIN or
// RST) when it chooses, as an upstream's own idle timeout does.
type closingUpstream struct {
	ln      net.Listener
	mu      sync.Mutex
	got     map[string]int
	idle    map[net.Conn]bool
	accepts int
	tls     *tls.Config           // https when set
	raw     map[net.Conn]net.Conn // the TCP connection under a TLS one
	// done: closed when the connection's goroutine has ended, and so its
	// socket too (Go closes a socket when its last reader returns).
	done map[net.Conn]chan struct{}
	url  string
	pool *x509.CertPool
}

func newClosingUpstream(t *testing.T) *closingUpstream {
	u := &closingUpstream{got: map[string]int{}, idle: map[net.Conn]bool{}, raw: map[net.Conn]net.Conn{}, done: map[net.Conn]chan struct{}{}}
	u.ln = serveRaw(t, u.serve)
	u.url = "http://" + u.ln.Addr().String()
	return u
}

// newClosingUpstreamTLS is an closingUpstream over TLS (an https upstream).
func newClosingUpstreamTLS(t *testing.T) *closingUpstream {
	hs := httptest.NewUnstartedServer(http.NotFoundHandler())
	hs.StartTLS()
	cert := hs.TLS.Certificates
	pool := x509.NewCertPool()
	pool.AddCert(hs.Certificate())
	hs.Close()
	u := &closingUpstream{got: map[string]int{}, idle: map[net.Conn]bool{}, raw: map[net.Conn]net.Conn{}, done: map[net.Conn]chan struct{}{}, pool: pool,
		tls: &tls.Config{Certificates: cert, NextProtos: []string{"http/1.1"}}}
	u.ln = serveRaw(t, u.serve)
	u.url = "https://" + u.ln.Addr().String()
	return u
}

// newClosingUpstreamUnix is a closingUpstream on a Unix socket.
func newClosingUpstreamUnix(t *testing.T) *closingUpstream {
	u := &closingUpstream{got: map[string]int{}, idle: map[net.Conn]bool{}, raw: map[net.Conn]net.Conn{}, done: map[net.Conn]chan struct{}{}}
	path := t.TempDir() + "/up.sock"
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	u.ln = serveOn(t, ln, u.serve)
	u.url = "unix:" + path
	return u
}

func (u *closingUpstream) serve(c net.Conn) {
	u.mu.Lock()
	u.accepts++
	u.mu.Unlock()
	if u.tls != nil {
		tc := tls.Server(c, u.tls)
		u.mu.Lock()
		u.raw[tc] = c
		u.mu.Unlock()
		c = tc
	}
	done := make(chan struct{})
	u.mu.Lock()
	u.done[c] = done
	u.mu.Unlock()
	defer close(done)
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		if _, err := br.Peek(1); err != nil {
			return
		}
		u.mu.Lock()
		delete(u.idle, c)
		u.mu.Unlock()
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.got[string(body)]++
		u.idle[c] = true
		u.mu.Unlock()
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// closeIdle closes every idle connection, with a RST when rst, and
// returns how many, once their sockets are closed: on loopback the FIN
// (or RST) is then in the gate's socket.
func (u *closingUpstream) closeIdle(rst bool) int {
	var closed []chan struct{}
	defer func() {
		for _, done := range closed {
			<-done
		}
	}()
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for c := range u.idle {
		if rst {
			r := c
			if rc, ok := u.raw[c]; ok {
				r = rc
			}
			if tc, ok := r.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			} else {
				continue // a Unix socket has no RST
			}
			_ = r.Close()
		}
		_ = c.Close()
		closed = append(closed, u.done[c])
		delete(u.idle, c)
		n++
	}
	return n
}

func (u *closingUpstream) count(body string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.got[body]
}

// closingGate serves a gate on kind in front of upstream, one resource
// job:1 held with token returned.
func closingGate(t *testing.T, kind engine, up *closingUpstream, set func(*Options)) (addr string, token uint64, st *memstore.Store) {
	t.Helper()
	addr, token, st, _ = closingServer(t, kind, up, set)
	return addr, token, st
}

// closingServer is closingGate with the gate's Server.
func closingServer(t *testing.T, kind engine, up *closingUpstream, set func(*Options)) (addr string, token uint64, st *memstore.Store, s *Server) {
	t.Helper()
	st = memstore.New(memstore.Options{})
	l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:1", Owner: "holder", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ParseRules(testRules)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(up.url)
	o := Options{Upstream: u, Store: st, Rules: rules, ServerName: "gate:80", UpstreamTimeout: 5 * time.Second}
	if up.pool != nil {
		o.UpstreamTLS = &tls.Config{RootCAs: up.pool, MinVersion: tls.VersionTLS12}
	}
	if set != nil {
		set(&o)
	}
	g, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s = NewServer(g, ServerOptions{NoIOURing: kind == engineLoopsPlainIO})
	s.noLoops = kind == engineGeneral
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return ln.Addr().String(), uint64(l.Token), st, s
}

// keepAliveClient is one keep-alive client connection to the gate.
type keepAliveClient struct {
	c       net.Conn
	br      *bufio.Reader
	chunked bool
	addr    string
	method  string // PUT when empty
}

func dialKeepAliveClient(t *testing.T, addr string) *keepAliveClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &keepAliveClient{c: c, br: bufio.NewReader(c), addr: addr}
}

// put sends one fenced write with body and returns the gate's status and
// problem body.
func (a *keepAliveClient) put(t *testing.T, path string, token uint64, body string) (int, string) {
	t.Helper()
	m := a.method
	if m == "" {
		m = "PUT"
	}
	req := m + " " + path + " HTTP/1.1\r\nHost: gate\r\nFencing-Token: " + strconv.FormatUint(token, 10) +
		"\r\nContent-Type: text/plain\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if a.chunked {
		req = m + " " + path + " HTTP/1.1\r\nHost: gate\r\nFencing-Token: " + strconv.FormatUint(token, 10) +
			"\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
	}
	_ = a.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(a.c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(a.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Close { // the gate ends the client's connection: the next write on a new one
		a.c.Close()
		c, err := net.Dial("tcp", a.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a.c, a.br = c, bufio.NewReader(c)
	}
	return resp.StatusCode, string(b)
}

// reuseTally counts, for a run of writes, how each ended.
type reuseTally struct {
	ok, failedReceived, failedNotReceived, doubled, lost int
	sample                                               string
}

func (r reuseTally) String() string {
	return fmt.Sprintf("2xx=%d 5xx(upstream got it)=%d 5xx(upstream never got it)=%d doubled=%d lost-2xx=%d",
		r.ok, r.failedReceived, r.failedNotReceived, r.doubled, r.lost)
}

func (r *reuseTally) add(t *testing.T, up *closingUpstream, status int, problem, body string) {
	n := up.count(body)
	if n > 1 {
		r.doubled++
	}
	switch {
	case status >= 200 && status < 300:
		r.ok++
		if n != 1 {
			r.lost++
		}
	default:
		if n > 0 {
			r.failedReceived++
		} else {
			r.failedNotReceived++
			if r.sample == "" {
				r.sample = strconv.Itoa(status) + " " + problem
			}
		}
	}
}

// reuseCase is a gate engine, an upstream and a kind of write.
type reuseCase struct {
	name    string
	kind    engine
	up      func(*testing.T) *closingUpstream
	chunked bool // a chunked body: the loops hand the write to the general engine
	large   bool // a body over FENCEGATE_BODY_BUFFER: the same
}

var reuseCases = []reuseCase{
	{name: "event loops", kind: engineLoops, up: newClosingUpstream},
	{name: "event loops without io_uring", kind: engineLoopsPlainIO, up: newClosingUpstream},
	{name: "general engine", kind: engineGeneral, up: newClosingUpstream},
	{name: "event loops, chunked write", kind: engineLoops, up: newClosingUpstream, chunked: true},
	{name: "event loops, 40 KB write", kind: engineLoops, up: newClosingUpstream, large: true},
	{name: "event loops, https upstream", kind: engineLoops, up: newClosingUpstreamTLS},
	{name: "event loops, unix upstream", kind: engineLoops, up: newClosingUpstreamUnix},
}

// TestWritesGoOnWhenTheUpstreamClosedIdleConnections: the upstream closes the idle
// keep-alive connection (FIN, or RST) and only then does the holder send
// its next write. The close is in the gate's socket before the write
// arrives at the gate: the gate can know the connection is dead (a last
// look at the socket before reuse, as the event loops' pass does, or a
// dial because nothing was written). Every write should be forwarded
// exactly once and answered 2xx: this is an upstream's ordinary idle
// timeout, not a fault.
func TestWritesGoOnWhenTheUpstreamClosedIdleConnections(t *testing.T) {
	const writes = 40
	for _, tc := range reuseCases {
		for _, rst := range []bool{false, true} {
			name := tc.name + "/FIN"
			if rst {
				name = tc.name + "/RST"
			}
			t.Run(name, func(t *testing.T) {
				up := tc.up(t)
				if rst && strings.HasPrefix(up.url, "unix:") {
					t.Skip("no RST on a Unix socket")
				}
				addr, token, _ := closingGate(t, tc.kind, up, func(o *Options) { o.TimeoutGrace = NoGrace })
				cl := dialKeepAliveClient(t, addr)
				cl.chunked = tc.chunked
				var r reuseTally
				for i := range writes {
					body := fmt.Sprintf("%s-w%d", name, i)
					if tc.large {
						body += strings.Repeat(".", 40000)
					}
					status, problem := cl.put(t, "/jobs/1", token, body)
					r.add(t, up, status, problem, body)
					// The upstream's idle timeout fires now.
					if up.closeIdle(rst) == 0 && status == 200 {
						t.Fatalf("write %d: no idle upstream connection to close", i)
					}
				}
				t.Logf("%s: %v accepts=%d first failure: %s", name, r, up.accepts, r.sample)
				if r.failedNotReceived > 0 || r.doubled > 0 || r.lost > 0 {
					t.Errorf("%s: %v: a valid holder's write failed on a connection the upstream had closed before it was sent (%s)", name, r, r.sample)
				}
			})
		}
	}
}

// TestLoopsLookAtAnIdleConnectionBeforeTheWrite: the upstream closes an
// idle keep-alive connection in the moment between the loop's look at
// its sockets' events and its forwarding of a write it has admitted in
// that pass (here: the loop is held, by a function posted to it, after it
// read and admitted the write). The loop has not seen the close: it must
// not send the write on that connection, which the upstream will never
// read (a 502 "may have been applied" for a write the upstream never got,
// and the barrier held for the grace against the next holder), but look
// at the socket first and take another. Judged from the upstream's own
// record: every write received once, all 2xx.
func TestLoopsLookAtAnIdleConnectionBeforeTheWrite(t *testing.T) {
	const writes = 12
	for _, kind := range []engine{engineLoops, engineLoopsPlainIO} {
		for _, rst := range []bool{false, true} {
			name := map[engine]string{engineLoops: "event loops", engineLoopsPlainIO: "event loops without io_uring"}[kind]
			name += map[bool]string{false: "/FIN", true: "/RST"}[rst]
			t.Run(name, func(t *testing.T) {
				up := newClosingUpstream(t)
				addr, token, _, s := closingServer(t, kind, up, func(o *Options) { o.TimeoutGrace = NoGrace })
				waitFor(t, "the event loops", func() bool { return s.engine() != nil })
				e := s.engine()
				cl := dialKeepAliveClient(t, addr)
				var r reuseTally
				if status, problem := cl.put(t, "/jobs/1", token, name+"-first"); status != 200 {
					t.Fatalf("first write: %d %s", status, problem)
				}
				for i := range writes {
					body := fmt.Sprintf("%s-w%d", name, i)
					before := holdLoops(t, e)
					before.wait()
					req := "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: " + strconv.FormatUint(token, 10) +
						"\r\nContent-Type: text/plain\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
					_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
					if _, err := io.WriteString(cl.c, req); err != nil {
						t.Fatal(err)
					}
					// The next pass reads the write from its events, then
					// runs this hold from its inbox, then forwards.
					during := holdLoops(t, e)
					// The connection has been idle for a while: the loop
					// looks at those idle for upstreamLook and longer.
					time.Sleep(2 * upstreamLook)
					before.release()
					during.wait()
					closed := up.closeIdle(rst) // the upstream's idle timeout
					during.release()
					resp, err := http.ReadResponse(cl.br, nil)
					if err != nil {
						t.Fatal(err)
					}
					problem, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if closed == 0 && resp.StatusCode == 200 {
						t.Fatalf("write %d: no idle upstream connection was closed", i)
					}
					r.add(t, up, resp.StatusCode, string(problem), body)
					if r.failedNotReceived+r.doubled+r.lost > 0 {
						break // the next write finds no idle connection to close
					}
					if resp.Close {
						t.Fatalf("write %d: the gate ended the client's connection (%d %s)", i, resp.StatusCode, problem)
					}
				}
				t.Logf("%s: %v accepts=%d first failure: %s", name, r, up.accepts, r.sample)
				if r.failedNotReceived > 0 || r.doubled > 0 || r.lost > 0 {
					t.Errorf("%s: %v: a write went onto a connection the upstream had closed before the loop sent it (%s)", name, r, r.sample)
				}
			})
		}
	}
}

// loopHold is a function posted to every event loop of an engine that
// holds the loop until released (at the latest when the test ends).
type loopHold struct {
	held, free chan struct{}
	loops      int
	once       sync.Once
}

func holdLoops(t *testing.T, e *loopEngine) *loopHold {
	t.Helper()
	h := &loopHold{held: make(chan struct{}, len(e.loops)), free: make(chan struct{}), loops: len(e.loops)}
	t.Cleanup(h.release)
	for _, l := range e.loops {
		if !l.post(func() { h.held <- struct{}{}; <-h.free }) {
			t.Fatal("a loop refused the posted function")
		}
	}
	return h
}

// wait returns once every loop runs the hold.
func (h *loopHold) wait() {
	for range h.loops {
		<-h.held
	}
}

func (h *loopHold) release() { h.once.Do(func() { close(h.free) }) }
