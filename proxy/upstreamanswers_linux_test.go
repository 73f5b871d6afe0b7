//go:build linux

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/syncbuf"
)

// What a hostile or broken upstream can do to the gate. A scripted
// upstream reads each request (head and Content-Length body) and, for a
// request whose X-Mark starts with "ok", answers 200 with the mark as its
// body; for any other it runs the case's script, which writes whatever bytes
// it likes and says whether the connection then goes on being served, is
// closed, or is held open without a word until the test ends.

type scriptedAfter int

const (
	scriptedServe scriptedAfter = iota // go on reading requests on this connection
	scriptedClose                      // close it
	scriptedHold                       // keep it open, silent, until the test ends
)

type scriptedScript func(c net.Conn, br *bufio.Reader, req *http.Request) scriptedAfter

// scriptedPoisoned is what a script returns to go on serving a connection it
// spoilt (bytes after a complete answer): later requests on it are noted.
const scriptedPoisoned scriptedAfter = 100

type scriptedUpstream struct {
	ln     net.Listener
	script scriptedScript
	done   chan struct{}

	mu       sync.Mutex
	marks    map[string]int // how many times each X-Mark arrived
	order    []string
	poisoned map[int]bool // connections a script answered on (and kept serving)
	onPoison []string     // marks that arrived on such a connection after
}

func newScriptedUpstream(t *testing.T, script scriptedScript) *scriptedUpstream {
	t.Helper()
	u := &scriptedUpstream{script: script, done: make(chan struct{}), marks: map[string]int{}, poisoned: map[int]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.ln = ln
	var wg sync.WaitGroup
	t.Cleanup(func() { close(u.done); ln.Close(); wg.Wait() })
	wg.Go(func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { u.serve(c, n) })
		}
	})
	return u
}

func (u *scriptedUpstream) serve(c net.Conn, n int) {
	defer c.Close()
	go func() { <-u.done; c.Close() }()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		mark := req.Header.Get("X-Mark")
		if req.Header.Get("X-Skip-Body") == "" {
			_, _ = io.Copy(io.Discard, req.Body)
		}
		u.mu.Lock()
		u.marks[mark]++
		u.order = append(u.order, mark)
		if u.poisoned[n] {
			u.onPoison = append(u.onPoison, mark)
		}
		u.mu.Unlock()
		if strings.HasPrefix(mark, "ok") {
			if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(mark), mark); err != nil {
				return
			}
			continue
		}
		switch u.script(c, br, req) {
		case scriptedServe:
		case scriptedPoisoned:
			u.mu.Lock()
			u.poisoned[n] = true
			u.mu.Unlock()
		case scriptedClose:
			return
		case scriptedHold:
			<-u.done
			return
		}
	}
}

func (u *scriptedUpstream) count(mark string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.marks[mark]
}

// scriptedGate is a gate in front of a scripted upstream, with a memory store
// (real clock), short upstream and barrier timeouts and a long grace.
type scriptedGate struct {
	g    *Gate
	gs   *gateServer
	st   *memstore.Store
	up   *scriptedUpstream
	addr string
	logs *syncbuf.Buffer
}

const (
	scriptedUpstreamTimeout = 1500 * time.Millisecond
	scriptedBarrierTimeout  = 300 * time.Millisecond
)

func newScriptedGate(t *testing.T, noLoops bool, script scriptedScript, opts ...func(*Options)) *scriptedGate {
	t.Helper()
	up := newScriptedUpstream(t, script)
	u, _ := url.Parse("http://" + up.ln.Addr().String())
	st := memstore.New(memstore.Options{})
	rules, err := ParseRules(testRules)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	o := Options{Upstream: u, Store: st, Rules: rules, UpstreamConns: 1,
		UpstreamTimeout: scriptedUpstreamTimeout, BarrierTimeout: scriptedBarrierTimeout, TimeoutGrace: time.Hour,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, f := range opts {
		f(&o)
	}
	g, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGateWith(t, g, ServerOptions{NoEventLoops: noLoops, Logger: o.Logger})
	if !noLoops {
		waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
		if gs.srv.loops.Load() == nil {
			t.Skip("no event loops on this listener")
		}
	}
	return &scriptedGate{g: g, gs: gs, st: st, up: up, addr: gs.Listener.Addr().String(), logs: logs}
}

// scriptedSeen is what a raw client saw: the final answer (interim ones skipped and
// counted), its body as read, and how reading it ended.
type scriptedSeen struct {
	status  int
	interim int
	header  http.Header
	body    string
	bodyErr error
	err     error // no final answer at all
}

func (s scriptedSeen) problemCode() string {
	if s.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	i := strings.Index(s.body, `"code":"`)
	if i < 0 {
		return ""
	}
	rest := s.body[i+len(`"code":"`):]
	return rest[:strings.IndexByte(rest, '"')]
}

func (s scriptedSeen) String() string {
	if s.err != nil {
		return fmt.Sprintf("no answer (%v) after %d interim", s.err, s.interim)
	}
	return fmt.Sprintf("%d (%d interim) body %q bodyErr %v", s.status, s.interim, scriptedTrunc(s.body), s.bodyErr)
}

func scriptedTrunc(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// scriptedDo sends raw on a new connection and reads one final answer.
func scriptedDo(addr, method, raw string, wait time.Duration) scriptedSeen {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return scriptedSeen{err: err}
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c, raw); err != nil {
		return scriptedSeen{err: err}
	}
	br := bufio.NewReader(c)
	var s scriptedSeen
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			s.err = err
			return s
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != 101 {
			s.interim++
			continue
		}
		s.status, s.header = resp.StatusCode, resp.Header
		b, err := io.ReadAll(resp.Body)
		s.body, s.bodyErr = string(b), err
		return s
	}
}

func (a *scriptedGate) lease(t *testing.T, res, owner string) fencing.Lease {
	t.Helper()
	l, err := a.st.Acquire(context.Background(), fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func scriptedWriteReq(path, mark string, token fencing.Token, extra string) string {
	return "PUT " + path + " HTTP/1.1\r\nHost: gate\r\nX-Mark: " + mark + "\r\nFencing-Token: " + token.String() +
		"\r\n" + extra + "Content-Length: 5\r\n\r\nhello"
}

func scriptedReadReq(method, path, mark string) string {
	return method + " " + path + " HTTP/1.1\r\nHost: gate\r\nX-Mark: " + mark + "\r\n\r\n"
}

// healthy checks the gate still serves a new client its own answer, and
// that no loop panicked.
func (a *scriptedGate) healthy(t *testing.T, mark string) {
	t.Helper()
	s := scriptedDo(a.addr, "GET", scriptedReadReq("GET", "/r", mark), 5*time.Second)
	if s.err != nil || s.status != 200 || s.body != mark {
		t.Errorf("the next client (%s) got %v, want 200 and its own answer %q", mark, s, mark)
	}
	if n := a.g.tel.panics.Load(); n != 0 {
		t.Errorf("%d panics contained in the loops; log:\n%s", n, a.logs.String())
	}
}

// barrierHolds sends a write with a token above lower's on res and
// reports whether it was refused barrier-timeout (the lower write still
// holds the resource) or forwarded.
func (a *scriptedGate) barrierHolds(t *testing.T, res, path string, lower fencing.Lease) bool {
	t.Helper()
	if _, err := a.st.Release(context.Background(), fencing.ReleaseRequest{Resource: res, Owner: lower.Owner, Token: lower.Token}); err != nil {
		t.Fatal(err)
	}
	b := a.lease(t, res, "b")
	s := scriptedDo(a.addr, "PUT", scriptedWriteReq(path, "ok-higher", b.Token, ""), 5*time.Second)
	switch {
	case s.status == 503 && s.problemCode() == "barrier-timeout":
		return true
	case s.status == 200 && s.body == "ok-higher":
		return false
	}
	t.Fatalf("the higher token's write got %v", s)
	return false
}

// scriptedUpCase is one upstream behaviour and what a client may see of it.
type scriptedUpCase struct {
	name   string
	answer string        // written once the request has been read
	after  scriptedAfter // then
	// custom, when set, writes the answer instead.
	custom func(c net.Conn)
	// What the client may get: the upstream's answer relayed (whole with
	// body, or cut off when cut), and/or a 502/504 problem.
	relay   bool
	body    string
	cut     bool
	problem bool
	reads   bool // also run it for a read
	poisons bool // the answer leaves bytes no request asked for on the connection
}

func scriptedManyHeaders(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "X-H%d: v\r\n", i)
	}
	return b.String()
}

var scriptedUpCases = []scriptedUpCase{
	{name: "no reason phrase", answer: "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", relay: true, body: "ok", problem: true, reads: true},
	{name: "status 000", answer: "HTTP/1.1 000 Zero\r\nContent-Length: 2\r\n\r\nok", problem: true, reads: true},
	{name: "status 099", answer: "HTTP/1.1 099 Low\r\nContent-Length: 2\r\n\r\nok", problem: true, reads: true},
	{name: "status 600", answer: "HTTP/1.1 600 High\r\nContent-Length: 2\r\n\r\nok", relay: true, body: "ok", problem: true, reads: true},
	{name: "status 999", answer: "HTTP/1.1 999 High\r\nContent-Length: 2\r\n\r\nok", relay: true, body: "ok", problem: true, reads: true},
	{name: "status 1000", answer: "HTTP/1.1 1000 Big\r\nContent-Length: 2\r\n\r\nok", problem: true, reads: true},
	{name: "HTTP/0.9 body only", answer: "just a body\n", after: scriptedClose, problem: true, reads: true},
	{name: "HTTP/2.0 status line", answer: "HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok", relay: true, body: "ok", problem: true, reads: true},
	{name: "HTTP/1.2 status line", answer: "HTTP/1.2 200 OK\r\nContent-Length: 2\r\n\r\nok", relay: true, body: "ok", problem: true, reads: true},
	{name: "huge single header", answer: "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 200<<10) + "\r\nContent-Length: 2\r\n\r\nok", problem: true, relay: true, body: "ok", reads: true},
	{name: "thousands of headers", answer: "HTTP/1.1 200 OK\r\n" + scriptedManyHeaders(5000) + "Content-Length: 2\r\n\r\nok", problem: true, relay: true, body: "ok", reads: true},
	{name: "header without colon", answer: "HTTP/1.1 200 OK\r\nNoColonHere\r\nContent-Length: 2\r\n\r\nok", problem: true, reads: true},
	{name: "obs-fold", answer: "HTTP/1.1 200 OK\r\nX-A: a\r\n folded\r\nContent-Length: 2\r\n\r\nok", problem: true, relay: true, body: "ok", reads: true},
	{name: "NUL in a header", answer: "HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nok", problem: true, reads: true},
	{name: "Content-Length and chunked", answer: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", problem: true, relay: true, body: "ok", reads: true},
	{name: "two Content-Lengths", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 7\r\n\r\nokokoko", problem: true, reads: true},
	{name: "negative Content-Length", answer: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nok", problem: true, reads: true},
	{name: "huge Content-Length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nok", after: scriptedClose, problem: true, relay: true, cut: true, reads: true},
	{name: "Content-Length 2^63-1, closes", answer: "HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775807\r\n\r\nok", after: scriptedClose, problem: true, relay: true, cut: true, reads: true},
	{name: "gzip Transfer-Encoding", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", problem: true, relay: true, reads: true},
	{name: "chunk size 2^63", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8000000000000000\r\nabc", after: scriptedClose, relay: true, cut: true, reads: true},
	{name: "chunk size 2^64", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\nabc", after: scriptedClose, relay: true, cut: true, reads: true},
	{name: "chunk size 2^63-1", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\nabc", after: scriptedClose, relay: true, cut: true, reads: true},
	{name: "chunk extensions", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;a=b;c=\"d;e\"\r\nok\r\n0;z=1\r\n\r\n", after: scriptedServe, relay: true, body: "ok", reads: true},
	{name: "trailers with framing fields", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n2\r\nok\r\n0\r\nContent-Length: 999\r\nTransfer-Encoding: chunked\r\nX-T: 1\r\n\r\n", after: scriptedServe, relay: true, body: "ok", reads: true},
	{name: "5000 interim 103", answer: strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", 5000) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", after: scriptedServe, relay: true, body: "ok", problem: true, reads: true},
	{name: "5000 interim 100", answer: strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 5000) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", after: scriptedServe, relay: true, body: "ok", problem: true, reads: true},
	{name: "101 websocket unasked", answer: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw tunnel bytes", after: scriptedHold, problem: true, reads: true},
	{name: "101 bare unasked", answer: "HTTP/1.1 101 Switching Protocols\r\n\r\nraw tunnel bytes", after: scriptedHold, problem: true, reads: true},
	{name: "close-delimited body", answer: "HTTP/1.1 200 OK\r\n\r\nuntil the close", after: scriptedClose, relay: true, body: "until the close", reads: true},
	{name: "closes mid status line", answer: "HTTP/1.1 20", after: scriptedClose, problem: true},
	{name: "closes mid head", answer: "HTTP/1.1 200 OK\r\nContent-Le", after: scriptedClose, problem: true},
	{name: "closes right after the head", answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", after: scriptedClose, relay: true, cut: true, reads: true},
	{name: "closes mid body", answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", after: scriptedClose, relay: true, cut: true, reads: true},
	{name: "closes mid chunk", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\nabc", after: scriptedClose, relay: true, cut: true, reads: true},
	{name: "second unsolicited response", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged", after: scriptedServe, relay: true, body: "ok", reads: true, poisons: true},
	{name: "unsolicited interim after", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 100 Continue\r\n\r\n", after: scriptedServe, relay: true, body: "ok", reads: true, poisons: true},
	{name: "chunked then unsolicited", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged", after: scriptedServe, relay: true, body: "ok", reads: true, poisons: true},
	{name: "204 with a body", answer: "HTTP/1.1 204 No Content\r\nContent-Length: 6\r\n\r\nforged", after: scriptedServe, relay: true, reads: true, poisons: true},
	{name: "304 with a chunked body", answer: "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nforged\r\n0\r\n\r\n", after: scriptedServe, relay: true, reads: true, poisons: true},
	{name: "204 with a body later", custom: func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		time.Sleep(30 * time.Millisecond)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
	}, after: scriptedServe, relay: true, reads: true, poisons: true},
	{name: "stalls after the head", answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", after: scriptedHold, relay: true, cut: true, reads: true},
	{name: "stalls before answering", answer: "", after: scriptedHold, problem: true, reads: true},
	{name: "stalls mid head", answer: "HTTP/1.1 200 OK\r\nX-A: 1\r\n", after: scriptedHold, problem: true, reads: true},
	{name: "byte by byte past the timeout", custom: func(c net.Conn) {
		for _, b := range []byte("HTTP/1.1 200 OK\r\nX-Slow: " + strings.Repeat("s", 100) + "\r\nContent-Length: 2\r\n\r\nok") {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
	}, after: scriptedClose, problem: true, reads: true},
	{name: "body byte by byte past the timeout", custom: func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n")
		for range 200 {
			if _, err := c.Write([]byte{'b'}); err != nil {
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
	}, after: scriptedClose, relay: true, cut: true, reads: true},
	{name: "interim answers forever", custom: func(c net.Conn) {
		for {
			if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"); err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}, after: scriptedClose, problem: true, reads: true},
	{name: "answers before the body, then closes", answer: "HTTP/1.1 413 Too Large\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno", after: scriptedClose, relay: true, body: "no", problem: true},
	{name: "answers before the body, keeps reading", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", after: scriptedServe, relay: true, body: "ok"},
}

// TestUpstreamAnswers runs every scriptedUpCase on both engines, for a fenced
// write and (where reads) a read: the client gets a clear answer (the
// upstream's relayed, whole or visibly cut off, or a 502/504 problem); a
// write whose answer was a problem after it was sent holds its resource
// (a higher token waits, here past its barrier timeout), one whose answer
// head was relayed does not; every write reaches the upstream once; the
// next client gets its own answer; no loop panics.
func TestUpstreamAnswers(t *testing.T) {
	for _, noLoops := range []bool{false, true} {
		engineName := map[bool]string{false: "loops", true: "general"}[noLoops]
		t.Run(engineName, func(t *testing.T) {
			for _, tc := range scriptedUpCases {
				for _, kind := range []string{"write", "read", "head"} {
					if kind != "write" && !tc.reads {
						continue
					}
					if kind == "head" && !strings.Contains(tc.name, "204") && !strings.Contains(tc.name, "304") && !strings.Contains(tc.name, "unsolicited") {
						continue
					}
					t.Run(tc.name+"/"+kind, func(t *testing.T) {
						t.Parallel()
						scriptedRunUpCase(t, noLoops, tc, kind)
					})
				}
			}
		})
	}
}

func scriptedRunUpCase(t *testing.T, noLoops bool, tc scriptedUpCase, kind string) {
	script := func(c net.Conn, br *bufio.Reader, req *http.Request) scriptedAfter {
		if tc.custom != nil {
			tc.custom(c)
		} else if tc.answer != "" {
			_, _ = io.WriteString(c, tc.answer)
		}
		if tc.poisons {
			return scriptedPoisoned
		}
		return tc.after
	}
	a := newScriptedGate(t, noLoops, script)
	mark := "case"
	var s scriptedSeen
	var l fencing.Lease
	switch kind {
	case "write":
		l = a.lease(t, "job:1", "a")
		extra := ""
		if strings.HasPrefix(tc.name, "answers before the body") {
			extra = "X-Skip-Body: 1\r\n"
		}
		s = scriptedDo(a.addr, "PUT", scriptedWriteReq("/jobs/1", mark, l.Token, extra), 8*time.Second)
	case "read":
		s = scriptedDo(a.addr, "GET", scriptedReadReq("GET", "/r", mark), 8*time.Second)
	case "head":
		s = scriptedDo(a.addr, "HEAD", scriptedReadReq("HEAD", "/r", mark), 8*time.Second)
	}
	problem := (s.status == 502 && s.problemCode() == "upstream-unavailable") || (s.status == 504 && s.problemCode() == "upstream-timeout")
	relayed := s.err == nil && !problem
	switch {
	case s.err != nil:
		t.Errorf("no clear answer: %v", s)
	case problem && !tc.problem:
		t.Errorf("got a problem, want the upstream's answer relayed: %v", s)
	case relayed && !tc.relay:
		t.Errorf("got %v relayed, want a 502/504 problem", s)
	case relayed && s.bodyErr != nil && !tc.cut:
		t.Errorf("the answer was cut off: %v", s)
	case relayed && s.bodyErr == nil && tc.body != "" && kind != "head" && s.body != tc.body:
		t.Errorf("the answer's body %q, want %q", s.body, tc.body)
	case relayed && strings.Contains(s.body, "forged"):
		t.Errorf("the client got bytes no request asked for: %v", s)
	}
	t.Logf("client saw: %v", s)
	time.Sleep(100 * time.Millisecond) // late bytes (a script's sleep) arrive before the next request: bytes that cross a request cannot be told from its answer
	if kind == "write" {
		if n := a.up.count(mark); n != 1 {
			t.Errorf("the write reached the upstream %d times", n)
		}
		held := a.barrierHolds(t, "job:1", "/jobs/1", l)
		switch {
		case problem && !held:
			t.Errorf("the write was answered %d %s (sent, outcome unknown) but a higher token was forwarded at once: no grace hold", s.status, s.problemCode())
		case s.err != nil && !held:
			t.Errorf("the write got no answer at all and a higher token was forwarded at once")
		case relayed && held:
			t.Errorf("the write's answer was relayed (%d) yet its resource stays held", s.status)
		}
	}
	if noLoops {
		time.Sleep(100 * time.Millisecond) // net/http's documented race on a poisoned idle connection
	}
	a.healthy(t, "ok-next")
	a.up.mu.Lock()
	defer a.up.mu.Unlock()
	if len(a.up.onPoison) > 0 {
		t.Errorf("requests %v reached the upstream on a connection it had spoilt", a.up.onPoison)
	}
}

// scriptedOne runs one upstream answer (raw bytes, then close or hold) for
// one request on one engine and returns what the client saw, whether a
// higher token was then held back (writes only), and the gate.
func scriptedOne(t *testing.T, noLoops bool, answer string, after scriptedAfter, kind string) (scriptedSeen, bool, *scriptedGate) {
	t.Helper()
	a := newScriptedGate(t, noLoops, func(c net.Conn, br *bufio.Reader, req *http.Request) scriptedAfter {
		_, _ = io.WriteString(c, answer)
		return after
	})
	var s scriptedSeen
	held := false
	switch kind {
	case "write":
		l := a.lease(t, "job:1", "a")
		s = scriptedDo(a.addr, "PUT", scriptedWriteReq("/jobs/1", "case", l.Token, ""), 8*time.Second)
		time.Sleep(50 * time.Millisecond)
		held = a.barrierHolds(t, "job:1", "/jobs/1", l)
	default:
		s = scriptedDo(a.addr, "GET", scriptedReadReq("GET", "/r", "case"), 8*time.Second)
	}
	return s, held, a
}

var scriptedEngines = []struct {
	name    string
	noLoops bool
}{{"event loops", false}, {"general engine", true}}

// TestUpstreamStatusBelow100: an upstream answering with a status
// line whose code is three digits below 100 ("HTTP/1.1 000 Zero") must get
// the client a 502 upstream-unavailable and, for a fenced write (sent,
// outcome unknown), hold the resource for the grace, as the event loops
// do. The general engine used to take it: ReverseProxy called
// WriteHeader(0), net/http panicked in the gate's handler, the client's
// connection closed without a byte, and the barrier was already left.
func TestUpstreamStatusBelow100(t *testing.T) {
	for _, e := range scriptedEngines {
		for _, code := range []string{"000", "099"} {
			for _, kind := range []string{"write", "read"} {
				t.Run(e.name+"/"+code+"/"+kind, func(t *testing.T) {
					s, held, a := scriptedOne(t, e.noLoops, "HTTP/1.1 "+code+" X\r\nContent-Length: 2\r\n\r\nok", scriptedClose, kind)
					for l := range strings.Lines(a.logs.String()) {
						if strings.Contains(l, "panic") {
							t.Logf("gate log: %s", scriptedTrunc(l))
						}
					}
					if s.err != nil || s.status != 502 || s.problemCode() != "upstream-unavailable" {
						t.Errorf("the client got %v, want 502 upstream-unavailable", s)
					}
					if kind == "write" && !held {
						t.Errorf("a higher token was forwarded at once after a write the upstream answered %s to (outcome unknown)", code)
					}
				})
			}
		}
	}
}

// TestUpstreamUnaskedSwitchOnAWrite: a 101 Switching Protocols the
// write never asked for (writes may never upgrade) is a broken answer
// after the write was sent: 502 "may have been applied", and its resource
// held for the grace (docs/gate.md, Barrier and timeouts), as the event
// loops do. The general engine used to leave the barrier on the 101
// head: a higher token was forwarded at once.
func TestUpstreamUnaskedSwitchOnAWrite(t *testing.T) {
	for _, e := range scriptedEngines {
		for name, answer := range map[string]string{
			"websocket": "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
			"bare":      "HTTP/1.1 101 Switching Protocols\r\n\r\n",
		} {
			t.Run(e.name+"/"+name, func(t *testing.T) {
				s, held, _ := scriptedOne(t, e.noLoops, answer, scriptedHold, "write")
				if s.status != 502 || s.problemCode() != "upstream-unavailable" {
					t.Errorf("the client got %v, want 502 upstream-unavailable", s)
				}
				if !held {
					t.Errorf("the client was told %q, yet a higher token was forwarded at once (no grace hold)", scriptedTrunc(s.body))
				}
			})
		}
	}
}

// TestUpstreamCutOffAnswerKeepsItsHead: an upstream whose answer's
// head arrived whole but whose body then breaks off (closes, stalls past
// the upstream timeout, a chunk size past 2^63) gets the client that head
// and the body cut off (the connection closed), on the event loops: the
// client knows the upstream answered (the gate left the write's barrier
// on that head). The general engine used to close the client's connection
// with no byte at all when the break came before net/http's server
// flushed anything: the client could not tell an applied write from one
// never answered.
func TestUpstreamCutOffAnswerKeepsItsHead(t *testing.T) {
	cases := map[string]struct {
		answer string
		after  scriptedAfter
	}{
		"closes right after the head": {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", scriptedClose},
		"closes mid body":             {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", scriptedClose},
		"stalls after the head":       {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab", scriptedHold},
		"chunk size 2^64":             {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\nabc", scriptedClose},
	}
	for _, e := range scriptedEngines {
		for name, c := range cases {
			for _, kind := range []string{"write", "read"} {
				t.Run(e.name+"/"+name+"/"+kind, func(t *testing.T) {
					s, held, _ := scriptedOne(t, e.noLoops, c.answer, c.after, kind)
					if s.err != nil || s.status != 200 {
						t.Errorf("the client got %v, want the upstream's 200 head, then the body cut off", s)
					}
					if kind == "write" && held {
						t.Errorf("the upstream's head arrived, yet the write still holds its resource")
					}
				})
			}
		}
	}
}

// TestUpstreamEarlyAnswerToAStreamedWrite: a streamed write (8 MiB,
// past the body buffer) that the upstream answers after its head alone,
// then closes without reading the body: the client gets the upstream's
// answer (or a 502), the write reaches the upstream once, and since the
// body was cut off after the answer began, its resource stays held for
// the grace (docs/gate.md, Barrier and timeouts).
func TestUpstreamEarlyAnswerToAStreamedWrite(t *testing.T) {
	for _, e := range scriptedEngines {
		t.Run(e.name, func(t *testing.T) {
			a := newScriptedGate(t, e.noLoops, func(c net.Conn, br *bufio.Reader, req *http.Request) scriptedAfter {
				_, _ = io.WriteString(c, "HTTP/1.1 413 Too Large\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
				return scriptedClose
			})
			l := a.lease(t, "job:1", "a")
			const size = 8 << 20
			c, err := net.Dial("tcp", a.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			go func() {
				_, _ = io.WriteString(c, fmt.Sprintf("PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Mark: case\r\nX-Skip-Body: 1\r\nFencing-Token: %s\r\nContent-Length: %d\r\n\r\n", l.Token, size))
				_, _ = c.Write(make([]byte, size))
			}()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			t.Logf("client saw %d %q", resp.StatusCode, scriptedTrunc(string(body)))
			if n := a.up.count("case"); n != 1 {
				t.Errorf("the write reached the upstream %d times", n)
			}
			c.Close()
			time.Sleep(100 * time.Millisecond)
			if !a.barrierHolds(t, "job:1", "/jobs/1", l) {
				t.Errorf("the write's body was cut off after the upstream's answer, yet a higher token was forwarded at once")
			}
			a.healthy(t, "ok-next")
		})
	}
}

// TestUpstreamEnginesAgreeOnOddAnswers: answers both engines refuse alike
// (502, and a fenced write's resource held for the grace: "may have been
// applied"), whatever engine serves the connection (a loop hands one to
// the general engine for a streamed body, Expect, HTTP/1.0 ...): statuses
// past 599, versions other than HTTP/1.x, a head past the 8 KiB bound in
// one read. The general engine used to relay the first ones, the loops the
// last. (An obs-fold header and a Content-Length beside chunked, which
// net/http reads and the loops refuse, still differ: the loops are the
// stricter, and net/http leaves no trace of them to check.)
func TestUpstreamEnginesAgreeOnOddAnswers(t *testing.T) {
	answers := map[string]string{
		"status 600":                "HTTP/1.1 600 High\r\nContent-Length: 2\r\n\r\nok",
		"status 999":                "HTTP/1.1 999 High\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/2.0":                  "HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.2":                  "HTTP/1.2 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"5000 headers (50 KB head)": "HTTP/1.1 200 OK\r\n" + scriptedManyHeaders(5000) + "Content-Length: 2\r\n\r\nok",
	}
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			var got [2]string
			for i, e := range scriptedEngines {
				s, held, _ := scriptedOne(t, e.noLoops, answer, scriptedClose, "write")
				got[i] = fmt.Sprintf("%d %s held=%v", s.status, s.problemCode(), held)
			}
			if got[0] != got[1] {
				t.Errorf("event loops: %s; general engine: %s", got[0], got[1])
			}
		})
	}
}
