//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/logwriter"
	"github.com/fencegate/fencegate/internal/uring"
)

// rawUpstream is an upstream on a bare socket: it records each request's
// bytes exactly as they arrived (head, and a Content-Length body) and
// answers with the canned response its X-Respond header names.
type rawUpstream struct {
	ln  net.Listener
	mu  sync.Mutex
	got []string
}

// cannedResponses are the upstream's answers, by X-Respond. Each covers a
// framing the event loops relay differently.
var cannedResponses = map[string]string{
	"":        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Up: 1\r\nContent-Length: 3\r\n\r\nok\n",
	"chunked": "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n",
	"close":   "HTTP/1.1 200 OK\r\nConnection: close\r\nX-Up: closing\r\n\r\nuntil the end",
	"204":     "HTTP/1.1 204 No Content\r\nX-Up: none\r\n\r\n",
	"304":     "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nContent-Length: 10\r\n\r\n",
	"103":     "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
	"hop":     "HTTP/1.1 200 OK\r\nConnection: X-Hop, keep-alive\r\nX-Hop: drop\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
	"hop2":    "HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nX-Hop: drop\r\nX-Set: a\r\nconnection: x-hop2, keep-alive\r\nX-Hop2: drop\r\nx-request-id: up\r\nX-Set: b\r\nX-Request-Id: up2\r\nContent-Length: 2\r\n\r\nok",
	"big":     "HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + strings.Repeat("0123456789", 20000),
	"headcl":  "HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n",
	"lower":   "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-up-name: 1\r\ncontent-length: 2\r\n\r\nok",
}

func newRawUpstream(t *testing.T) *rawUpstream {
	t.Helper()
	u := &rawUpstream{}
	u.ln = serveRaw(t, u.serve)
	return u
}

// serveRaw listens on loopback until the test ends and hands each
// connection to serve, on a goroutine of its own.
func serveRaw(t *testing.T, serve func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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
			go serve(c)
		}
	}()
	return ln
}

func (u *rawUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		var head bytes.Buffer
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			head.WriteString(line)
			if line == "\r\n" {
				break
			}
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head.Bytes())))
		if err != nil {
			return
		}
		body := make([]byte, max(req.ContentLength, 0))
		if _, err := io.ReadFull(br, body); err != nil {
			return
		}
		if len(req.TransferEncoding) > 0 {
			// A chunked body, read whole (as sent) before the answer.
			if body, err = readChunkedRaw(br); err != nil {
				return
			}
		}
		u.mu.Lock()
		u.got = append(u.got, head.String()+string(body))
		u.mu.Unlock()
		resp := cannedResponses[req.Header.Get("X-Respond")]
		if req.Method == http.MethodHead && req.Header.Get("X-Respond") == "" {
			resp = cannedResponses["headcl"]
		}
		if _, err := io.WriteString(c, resp); err != nil || strings.Contains(resp, "Connection: close") {
			return
		}
	}
}

// readChunkedRaw reads a chunked body from br to the end of its trailers
// and returns its bytes as sent.
func readChunkedRaw(br *bufio.Reader) ([]byte, error) {
	var raw []byte
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		raw = append(raw, line...)
		sizeText, _, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ";")
		size, err := strconv.ParseInt(strings.TrimSpace(sizeText), 16, 32)
		if err != nil {
			return nil, err
		}
		if size == 0 {
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return nil, err
				}
				raw = append(raw, line...)
				if line == "\r\n" {
					return raw, nil
				}
			}
		}
		data := make([]byte, size+2) // and its CRLF
		if _, err := io.ReadFull(br, data); err != nil {
			return nil, err
		}
		raw = append(raw, data...)
	}
}

// take returns the requests received since the last take, with the
// upstream's own address (each gate has its own upstream) as "UPSTREAM".
func (u *rawUpstream) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	got := u.got
	u.got = nil
	for i := range got {
		got[i] = strings.ReplaceAll(got[i], u.ln.Addr().String(), "UPSTREAM")
	}
	return got
}

// engineCases are requests, each sent alone on a connection, that the
// event loops serve themselves, and some they hand to the fallback.
var engineCases = []struct{ name, raw string }{
	{"read", "GET /r?x=1&y=%41 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r1\r\nAccept: */*\r\n\r\n"},
	{"fenced write", "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r2\r\nFencing-Token: 1\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{\"step\":1}"},
	{"stale write", "PUT /jobs/2 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r3\r\nFencing-Token: 1\r\nContent-Length: 2\r\n\r\nno"},
	{"write without token", "DELETE /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r4\r\n\r\n"},
	{"write closing", "DELETE /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r5\r\nFencing-Token: 1\r\nConnection: close\r\n\r\n"},
	{"claims repeated", "POST /health HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r30\r\nX-Forwarded-For: 6.6.6.6\r\nx-forwarded-for: 7.7.7.7\r\nX-Request-Id: forged\r\nX-Forwarded-Host: evil\r\nX-Forwarded-Host: evil2\r\nContent-Length: 0\r\n\r\n"},
	{"claims replaced", "POST /health HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r6\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nForwarded: for=6.6.6.6\r\nContent-Length: 0\r\n\r\n"},
	{"hop-by-hop answer", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r8\r\nX-Respond: hop2\r\n\r\n"},
	{"hop-by-hop", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r7\r\nConnection: X-Secret, Fencing-Token\r\nX-Secret: s\r\nTe: trailers, deflate\r\nKeep-Alive: 5\r\nProxy-Authorization: x\r\nX-Respond: hop\r\n\r\n"},
	{"head", "HEAD /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r8\r\n\r\n"},
	{"chunked answer", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r9\r\nX-Respond: chunked\r\n\r\n"},
	{"close-delimited answer", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r10\r\nX-Respond: close\r\n\r\n"},
	{"204", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r11\r\nX-Respond: 204\r\n\r\n"},
	{"304", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r12\r\nX-Respond: 304\r\n\r\n"},
	{"interim answer", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r13\r\nX-Respond: 103\r\n\r\n"},
	{"large answer", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r14\r\nX-Respond: big\r\n\r\n"},
	{"pipelined", "GET /a HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r15\r\n\r\nPUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r16\r\nFencing-Token: 1\r\nContent-Length: 1\r\n\r\nxGET /c HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r17\r\n\r\n"},
	{"denied", "GET /admin/x HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r18\r\n\r\n"},
	{"not canonical", "PUT /jobs/../jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r19\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"absolute form", "GET http://evil/r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r20\r\n\r\n"},
	{"lower-case answer", "GET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r31\r\nX-Respond: lower\r\n\r\n"},
	// Handed to the fallback server.
	{"chunked write", "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r21\r\nFencing-Token: 1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
	{"HTTP/1.0", "GET /r HTTP/1.0\r\nHost: gate\r\nX-Request-Id: r22\r\n\r\n"},
	{"expect", "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r23\r\nFencing-Token: 1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok"},
	{"large write", "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r24\r\nFencing-Token: 1\r\nContent-Length: 40000\r\n\r\n" + strings.Repeat("w", 40000)},
	{"bare LF", "GET /r HTTP/1.1\nHost: gate\nX-Request-Id: r25\n\n"},
	{"duplicate length", "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r26\r\nFencing-Token: 1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"},
	{"no host", "GET /r HTTP/1.1\r\nX-Request-Id: r27\r\n\r\n"},
	// A Host an upstream could read as a path, a query, an escape or
	// another authority: the general path's judgement, on both.
	{"host dot segments", "PUT /jobs/1 HTTP/1.1\r\nHost: x/../jobs/b\r\nX-Request-Id: h1\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"host blank", "PUT /jobs/1 HTTP/1.1\r\nHost: x y\r\nX-Request-Id: h2\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"host backslash", "PUT /jobs/1 HTTP/1.1\r\nHost: x\\y\r\nX-Request-Id: h3\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"host bracket", "PUT /jobs/1 HTTP/1.1\r\nHost: [::1\r\nX-Request-Id: h4\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"host query", "PUT /jobs/1 HTTP/1.1\r\nHost: x?y\r\nX-Request-Id: h5\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"host fragment", "PUT /jobs/1 HTTP/1.1\r\nHost: x#y\r\nX-Request-Id: h6\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"host escape", "PUT /jobs/1 HTTP/1.1\r\nHost: %2e%2e\r\nX-Request-Id: h7\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"broken escape", "PUT /jobs/%zz HTTP/1.1\r\nHost: gate\r\nX-Request-Id: h8\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n"},
	{"pipelined then chunked", "GET /a HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r28\r\n\r\nPUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r29\r\nFencing-Token: 1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n"},
}

// engineGate is a gate served by one engine, with its own upstream.
type engineGate struct {
	addr string
	up   *rawUpstream
}

// engine is how a test's gate serves its listener.
type engine int

const (
	engineLoops        engine = iota // the event loops, batching through io_uring where the kernel has it
	engineLoopsPlainIO               // the event loops, one system call per read and write
	engineGeneral                    // the general engine (net/http) alone
)

var engines = []engine{engineLoops, engineLoopsPlainIO, engineGeneral}

func (e engine) String() string {
	return [...]string{"event loops", "event loops without io_uring", "general engine"}[e]
}

func newEngineGate(t *testing.T, kind engine) *engineGate {
	t.Helper()
	ctx := context.Background()
	st := memstore.New(memstore.Options{})
	for _, res := range []string{"job:1", "job:2", "job:2"} {
		if _, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "o" + res, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job:2", Token: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: "job:2", Owner: "ojob:2", Token: 1}); err != nil {
		t.Fatal(err)
	}
	if l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:2", Owner: "new", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	} else if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job:2", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	up := newRawUpstream(t)
	rules, err := ParseRules(testRules)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("http://" + up.ln.Addr().String() + "/base?k=v")
	g, err := New(Options{Upstream: u, Store: st, Rules: rules, ServerName: "gate:80"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(g, ServerOptions{HeaderTimeout: 300 * time.Millisecond, NoIOURing: kind == engineLoopsPlainIO})
	s.noLoops = kind == engineGeneral
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return &engineGate{addr: ln.Addr().String(), up: up}
}

// exchange sends raw on a fresh connection and returns every response
// that comes back, as comparable text: status, headers (sorted, without
// Date), body. A failure to connect or send is t's error, and no
// responses: exchange may run on a goroutine of its own.
func (e *engineGate) exchange(t *testing.T, raw string) []string {
	t.Helper()
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Error(err)
		return nil
	}
	methods := regexp.MustCompile(`(?m)^(GET|PUT|POST|DELETE|HEAD) `).FindAllStringSubmatch(raw, -1)
	br := bufio.NewReader(c)
	var out []string
	final := 0
	for {
		wait := 2 * time.Second
		if final >= len(methods) {
			wait = 100 * time.Millisecond // anything more is unexpected
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		var req *http.Request
		if final < len(methods) {
			req = &http.Request{Method: methods[final][1]}
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return out
		}
		if resp.StatusCode < 200 {
			continue // interim answers: relayed by the general engine, dropped by the loops
		}
		final++
		if resp.StatusCode == http.StatusNotModified || resp.StatusCode == http.StatusNoContent {
			resp.Header.Del("Content-Length") // says nothing: such answers have no body
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		var b strings.Builder
		fmt.Fprintf(&b, "%d %v close=%v body=%q err=%v\n", resp.StatusCode, resp.ContentLength, resp.Close, body, err)
		resp.Header.Del("Date")
		_ = resp.Header.WriteSubset(&b, nil)
		out = append(out, b.String())
	}
}

// TestEnginesAgree sends the same requests through a gate served by the
// event loops and one served by fasthttp alone, and finds the same bytes
// at the upstream and the same answers at the client.
func TestEnginesAgree(t *testing.T) {
	for _, kind := range []engine{engineLoops, engineLoopsPlainIO} {
		// Each kind has its own two gates and upstreams, and the engines
		// share no state: the kinds run side by side, and so do the two
		// exchanges of a case (most of an exchange is its wait for
		// nothing more to arrive).
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			loops, plain := newEngineGate(t, kind), newEngineGate(t, engineGeneral)
			for _, tc := range engineCases {
				t.Run(tc.name, func(t *testing.T) {
					var got, want []string
					var wg sync.WaitGroup
					wg.Go(func() { got = loops.exchange(t, tc.raw) })
					wg.Go(func() { want = plain.exchange(t, tc.raw) })
					wg.Wait()
					if strings.Join(got, "\n") != strings.Join(want, "\n") {
						t.Errorf("answers differ\n%s:\n%s\nfasthttp:\n%s", kind, strings.Join(got, "\n"), strings.Join(want, "\n"))
					}
					if len(want) == 0 {
						t.Error("no answer at all")
					}
					gotUp, wantUp := canonicalRequests(t, loops.up.take()), canonicalRequests(t, plain.up.take())
					if strings.Join(gotUp, "\n--\n") != strings.Join(wantUp, "\n--\n") {
						t.Errorf("the upstream got different requests\n%s:\n%q\nfasthttp:\n%q", kind, gotUp, wantUp)
					}
				})
			}
		})
	}
}

// canonicalRequests is each raw request as the upstream reads it, in a
// form both engines must agree on: method, target, Host, the fields sorted
// by name (values in order, see comparable), and the body.
func canonicalRequests(t *testing.T, raws []string) []string {
	t.Helper()
	var out []string
	for _, raw := range raws {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			out = append(out, "unreadable: "+raw)
			continue
		}
		body, _ := io.ReadAll(r.Body)
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s Host %s TE %v body %q\n", r.Method, r.RequestURI, r.Host, r.TransferEncoding, body)
		_ = comparable(r.Header).WriteSubset(&b, nil)
		out = append(out, b.String())
	}
	return out
}

// TestClaimsAndOrderOnBothEngines: a client that repeats the headers the
// gate sets (X-Forwarded-*, X-Request-Id, Forwarded), in any case, gets
// none of its own to the upstream, only the gate's, once each; every
// field any of its Connection fields names is left out; and the
// fields the gate keeps reach the upstream in the order the client sent
// them, even when a dropped field came before them (repeated fields are
// a list whose order matters). Read from what the upstream received, on
// the event loops and on the fasthttp engine.
func TestClaimsAndOrderOnBothEngines(t *testing.T) {
	raw := "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nConnection: X-Hop\r\nX-Hop: 1\r\nX-Request-Id: mine\r\n" +
		"X-Forwarded-For: 6.6.6.6\r\nX-List: a\r\nx-forwarded-for: 7.7.7.7\r\nForwarded: for=6.6.6.6\r\nX-List: b\r\n" +
		"X-Forwarded-Proto: https\r\nX-Request-Id: forged\r\nKeep-Alive: 5\r\nX-List: c\r\nX-Forwarded-Host: evil\r\n" +
		"Connection: x-hop2\r\nX-Hop2: 2\r\n" +
		"Fencing-Token: 1\r\nContent-Length: 2\r\n\r\nok"
	for _, kind := range engines {
		e := newEngineGate(t, kind)
		if got := e.exchange(t, raw); len(got) != 1 || !strings.HasPrefix(got[0], "200 ") {
			t.Fatalf("%s: answers %q", kind, got)
		}
		up := e.up.take()
		if len(up) != 1 {
			t.Fatalf("%s: the upstream got %d requests", kind, len(up))
		}
		head := strings.ToLower(up[0])
		for field, want := range map[string]string{
			"x-forwarded-for: ": "127.0.0.1", "x-forwarded-host: ": "gate", "x-forwarded-proto: ": "http",
			"x-request-id: ": "mine", "forwarded: ": "", "x-hop: ": "", "x-hop2: ": "", "keep-alive: ": "",
		} {
			n := strings.Count(head, "\r\n"+field)
			switch {
			case want == "" && n != 0:
				t.Errorf("%s: the upstream got %q, which the gate drops:\n%s", kind, field, up[0])
			case want != "" && (n != 1 || !strings.Contains(head, "\r\n"+field+want+"\r\n")):
				t.Errorf("%s: the upstream got %d %q fields, want one, %q:\n%s", kind, n, field, want, up[0])
			}
		}
		if a, b, c := strings.Index(head, "x-list: a"), strings.Index(head, "x-list: b"), strings.Index(head, "x-list: c"); a < 0 || !(a < b && b < c) {
			t.Errorf("%s: X-List fields out of the client's order:\n%s", kind, up[0])
		}
	}
}

// TestResponseConnectionFieldsOnBothEngines: a header that any of the
// upstream's Connection fields names (the field may be repeated, its name
// in any case) never reaches the client, the fields around it keep their
// order, and the client gets the gate's request id only, never the
// upstream's; read from the client's answer on the event loops and on the
// fasthttp engine.
func TestResponseConnectionFieldsOnBothEngines(t *testing.T) {
	for _, kind := range engines {
		e := newEngineGate(t, kind)
		got := e.exchange(t, "GET /r HTTP/1.1\r\nHost: gate\r\nX-Respond: hop2\r\n\r\n")
		if len(got) != 1 || !strings.HasPrefix(got[0], "200 ") {
			t.Fatalf("%s: answers %q", kind, got)
		}
		if strings.Contains(got[0], "X-Hop") || !strings.Contains(got[0], "X-Set: a\r\nX-Set: b\r\n") ||
			strings.Count(got[0], "X-Request-Id: ") != 1 || strings.Contains(got[0], "X-Request-Id: up") {
			t.Errorf("%s: the client got the named fields, X-Set out of order, or not one gate's request id:\n%s", kind, got[0])
		}
	}
}

// newLeasedUpstream starts a raw upstream and a memory store holding a
// lease on job:1, for a gate in front of them.
func newLeasedUpstream(t *testing.T) (*rawUpstream, *url.URL, *memstore.Store, fencing.Lease) {
	t.Helper()
	up := newRawUpstream(t)
	u, _ := url.Parse("http://" + up.ln.Addr().String())
	st := memstore.New(memstore.Options{})
	l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:1", Owner: "o", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return up, u, st, l
}

// serveLeasedGate serves a gate with the test rules in front of a raw
// upstream and a memory store holding a lease on job:1 (see
// newLeasedUpstream), once its event loops run.
func serveLeasedGate(t *testing.T) (*rawUpstream, fencing.Lease, *gateServer) {
	t.Helper()
	up, u, st, l := newLeasedUpstream(t)
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: st, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	return up, l, gs
}

// TestLoopsServeTheListener: on Linux a TCP listener is served by the
// event loops, which keep plain requests and hand a connection to the
// fallback server only when a request needs it (here a chunked body).
func TestLoopsServeTheListener(t *testing.T) {
	up, l, gs := serveLeasedGate(t)
	e := gs.srv.engine()
	handed := func() int { return len(e.handedConns(false)) }
	ask := func(raw string) net.Conn {
		c, err := net.Dial("tcp", gs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%q: %v %v", raw, resp, err)
		}
		return c
	}
	ask("PUT /jobs/1 HTTP/1.1\r\nHost: g\r\nFencing-Token: " + tok(l.Token) + "\r\nContent-Length: 1\r\n\r\nx")
	if n := handed(); n != 0 {
		t.Fatalf("%d connections handed off after a plain request", n)
	}
	ask("PUT /jobs/1 HTTP/1.1\r\nHost: g\r\nFencing-Token: " + tok(l.Token) + "\r\nTransfer-Encoding: chunked\r\n\r\n1\r\ny\r\n0\r\n\r\n")
	if n := handed(); n != 1 {
		t.Fatalf("%d connections handed off after a chunked request, want 1", n)
	}
	if got := up.take(); len(got) != 2 || !strings.HasSuffix(got[0], "\r\n\r\nx") || !strings.Contains(got[1], "Transfer-Encoding: chunked") {
		t.Fatalf("the upstream got %q", got)
	}
}

// TestLoopUpstreamBreaksOff: when the upstream closes in the middle of a
// response body, the client's connection is closed too, at once: it
// cannot take the short body for a whole one.
func TestLoopUpstreamBreaksOff(t *testing.T) {
	c := dialGateBefore(t, func(up net.Conn) {
		_, _ = io.WriteString(up, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
	})
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if string(body) != "only ten b" || err != io.ErrUnexpectedEOF {
		t.Fatalf("got %q, %v; want the ten bytes, then the connection closed", body, err)
	}
}

// TestLoopSlowReaderBoundsMemory: a client that reads a large answer
// slowly holds the loop's relay to the client's pace, not the upstream's:
// the gate never holds much more than one read of it.
func TestLoopSlowReaderBoundsMemory(t *testing.T) {
	const size = 64 << 20
	c := dialGateBefore(t, func(up net.Conn) {
		fmt.Fprintf(up, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
		_, _ = io.Copy(up, &patternReader{n: size})
	})
	_ = c.(*net.TCPConn).SetReadBuffer(16 << 10)
	if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	var before, peak runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	buf := make([]byte, 256<<10)
	var n int64
	sum := sha256.New()
	for i := 0; ; i++ {
		m, err := resp.Body.Read(buf)
		n += int64(m)
		sum.Write(buf[:m])
		if err != nil {
			break
		}
		if i%64 == 0 {
			time.Sleep(time.Millisecond) // a slow reader
			runtime.GC()                 // what the gate holds, not its garbage
			runtime.ReadMemStats(&peak)
			if grown := int64(peak.HeapInuse) - int64(before.HeapInuse); grown > 16<<20 {
				t.Fatalf("the gate's heap grew by %d MiB while relaying", grown>>20)
			}
		}
	}
	if n != size || hex.EncodeToString(sum.Sum(nil)) != patternSum(size) {
		t.Fatalf("relayed %d bytes (want %d), or not the upstream's", n, size)
	}
}

// TestLoopsBatchThroughIOUring: where the test's kernel gives an io_uring,
// every loop has one (made on its own thread), and a server told not to
// use it (ServerOptions.NoIOURing, FENCEGATE_IO_URING=false) has none.
func TestLoopsBatchThroughIOUring(t *testing.T) {
	if r, err := uring.New(2); err != nil {
		t.Skipf("no io_uring here: %v", err)
	} else {
		_ = r.Close()
	}
	for _, plainIO := range []bool{false, true} {
		_, u, st, _ := newLeasedUpstream(t)
		g, err := New(Options{Upstream: u, Store: st})
		if err != nil {
			t.Fatal(err)
		}
		gs := serveGateWith(t, g, ServerOptions{NoIOURing: plainIO})
		resp, err := http.Get(gs.URL + "/r")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for i, l := range gs.srv.loops.Load().loops {
			var has bool
			l.call(func() { has = l.batchIO.ring != nil })
			if has == plainIO {
				t.Errorf("plain I/O %v: loop %d has a ring: %v", plainIO, i, has)
			}
		}
	}
}

// TestLoopReadsAheadAtMostOnce: a client that keeps sending pipelined
// requests while its first one waits for the upstream does not make the
// gate buffer them: the loop reads a socket ahead of its connection's
// steps only while nothing read before waits. Sent in small pieces (each
// one a new readiness event), the gate holds at most one read ahead of
// them; sent in bulk, the client's writes block once the kernel's buffers
// are full. The first answer then comes whole.
func TestLoopReadsAheadAtMostOnce(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	gs := serveGateBefore(t, func(up net.Conn) {
		<-release
		_, _ = io.WriteString(up, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
	})
	c, err := net.Dial("tcp", gs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /first HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	held := func() int { // bytes the loops hold unread from their clients
		n := 0
		for _, l := range gs.srv.loops.Load().loops {
			l.call(func() {
				for lc := range l.clients {
					n += len(lc.In)
				}
			})
		}
		return n
	}
	piece := []byte(strings.Repeat("GET /flood HTTP/1.1\r\nHost: g\r\n\r\n", 30)) // about 1 KiB
	for range 500 {
		if _, err := c.Write(piece); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := held(); n > loopAheadRead {
		t.Fatalf("the gate holds %d bytes of pipelined requests behind one waiting for the upstream (at most %d)", n, loopAheadRead)
	}
	const limit = 64 << 20
	bulk := bytes.Repeat(piece, 64)
	written := 0
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	for written < limit {
		n, err := c.Write(bulk)
		written += n
		if err != nil {
			break // blocked until the deadline: the gate stopped reading
		}
	}
	if n := held(); written >= limit || n > loopAheadRead {
		t.Fatalf("the client wrote %d MiB of pipelined requests in bulk; the gate holds %d bytes", written>>20, n)
	}
	open()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 5))
	if resp.StatusCode != http.StatusOK || string(body) != "first" || err != nil {
		t.Fatalf("first answer: %d %q %v", resp.StatusCode, body, err)
	}
}

// dialGateBefore serves a gate in front of an upstream that answers each
// request with answer (see serveGateBefore); it returns a connection to
// the gate, made once its event loops serve.
func dialGateBefore(t *testing.T, answer func(up net.Conn)) net.Conn {
	t.Helper()
	gs := serveGateBefore(t, answer)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	c, err := net.Dial("tcp", gs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// serveGateBefore serves a gate (memory store, no rules) in front of an
// upstream that reads each request and answers it with answer, then
// closes.
func serveGateBefore(t *testing.T, answer func(up net.Conn)) *gateServer {
	t.Helper()
	upLn := serveRaw(t, func(up net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(up)); err == nil {
			answer(up)
		}
		up.Close()
	})
	u, _ := url.Parse("http://" + upLn.Addr().String())
	g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	return serveGate(t, g)
}

// TestClientGoneMidWriteOnTheLoops: a client that hangs up after its
// fenced write reached the upstream, before the answer, frees nothing: the
// write stays in flight at the barrier until the upstream answers (the
// loops do not watch a client while its request is with the upstream), so
// a higher token waits (here until its barrier timeout) and passes only
// after that answer; the write is counted admitted, by its outcome. Read
// from the upstream's record.
func TestClientGoneMidWriteOnTheLoops(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	e := newEnv(t, testRules, func(o *Options) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.BarrierTimeout = 50 * time.Millisecond
		o.TimeoutGrace = time.Hour
	})
	arrived, release := make(chan struct{}), make(chan struct{})
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		if rec.Body == "slow" {
			close(arrived)
			<-release
		}
		return false
	}
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()
	a := e.acquire("job:1", "a", 10*time.Second)
	e.clock.Advance(11 * time.Second)
	b := e.acquire("job:1", "b", 10*time.Second)

	c, err := net.Dial("tcp", e.gateSrv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(c, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: %d\r\nContent-Length: 4\r\n\r\nslow", a.Token); err != nil {
		t.Fatal(err)
	}
	<-arrived
	c.Close()
	for range 3 { // each a full barrier timeout after the hang-up
		wantProblem(t, e.do("PUT", "/jobs/1", "early", HeaderToken, tok(b.Token)), 503, "barrier-timeout")
	}
	releaseOnce()
	waitFor(t, "the barrier to empty", func() bool { return e.gate.InFlightResources() == 0 })
	if r := e.do("PUT", "/jobs/1", "after", HeaderToken, tok(b.Token)); r.Status != 200 {
		t.Fatalf("the higher token after the answer: %d %s", r.Status, r.Body)
	}
	got := e.up.requests()
	if len(got) != 2 || got[0].Body != "slow" || got[1].Body != "after" {
		t.Fatalf("the upstream got %+v, want the gone client's write, then the higher token's", got)
	}
	// Counted by outcome: the gone client's write was answered.
	if got, want := writeCounts(t, reader), "admitted PUT=2\nbarrier-timeout PUT=3"; got != want {
		t.Fatalf("fencegate.gate.writes\n got:\n%s\nwant:\n%s", got, want)
	}
}

// countingBatch is a logwriter.Writer that counts how often it was held
// and checks that every Hold is matched by one Release.
type countingBatch struct {
	*logwriter.Writer
	holds, open atomic.Int64
}

func (b *countingBatch) Hold()    { b.holds.Add(1); b.open.Add(1); b.Writer.Hold() }
func (b *countingBatch) Release() { b.open.Add(-1); b.Writer.Release() }

// TestLoopsGatherTheAuditLinesOfAPass: with Options.LogBatch, the event
// loops hold the log's output for each pass, and every write's audit line
// still reaches it, whole and once, at the end of the pass that answered
// the write.
func TestLoopsGatherTheAuditLinesOfAPass(t *testing.T) {
	up, u, st, l := newLeasedUpstream(t)
	var mu sync.Mutex
	var out bytes.Buffer
	lw := logwriter.New(logOutput(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(p) == 0 || p[len(p)-1] != '\n' {
			t.Errorf("a write of %d bytes to the log ends inside a line: %q", len(p), p)
		}
		return out.Write(p)
	}))
	batch := &countingBatch{Writer: lw}
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: st, Rules: rules, LogBatch: batch,
		Logger: slog.New(slog.NewJSONHandler(lw, nil))})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	const clients, writes = 8, 25
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			c := gs.Client()
			for range writes {
				if !writeJob1(t, gs, c, l.Token, "x") {
					return
				}
			}
		})
	}
	wg.Wait()
	logged := func() (lines, admitted int, text string) {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(out.String(), `"msg":"gate write"`), strings.Count(out.String(), `"code":"admitted"`), out.String()
	}
	// A write's line goes out at the end of the pass that answered it.
	waitFor(t, "every audit line", func() bool { n, _, _ := logged(); return n >= clients*writes })
	if lines, admitted, text := logged(); lines != clients*writes || admitted != clients*writes {
		t.Fatalf("%d audit lines (%d admitted) for %d writes:\n%s", lines, admitted, clients*writes, text)
	}
	if n := len(up.take()); n != clients*writes {
		t.Fatalf("the upstream got %d writes, want %d", n, clients*writes)
	}
	if batch.holds.Load() == 0 {
		t.Fatal("the loops never held the log")
	}
	waitFor(t, "every pass to release the log", func() bool { return batch.open.Load() == 0 })
}

// TestLoopsGoOnWhenTheRingFails: when a loop's io_uring fails (here every
// loop's ring is swapped, mid-run, for one bound to another thread, whose
// submits the kernel refuses), the loop drops it and goes on with one
// system call per read and write: every write is answered 200 and reaches
// the upstream exactly once, none is lost or sent twice. Read from the
// upstream's record.
func TestLoopsGoOnWhenTheRingFails(t *testing.T) {
	up, l, gs := serveLeasedGate(t)
	loops := gs.srv.loops.Load().loops
	rings := func() (n int) {
		for _, lp := range loops {
			lp.call(func() {
				if lp.batchIO.ring != nil {
					n++
				}
			})
		}
		return n
	}
	if rings() == 0 {
		t.Skip("no io_uring here")
	}
	const clients, writes = 8, 40
	var done atomic.Int32
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		waitFor(t, "half the writes", func() bool { return done.Load() >= clients*writes/2 })
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for _, lp := range loops {
			foreign, err := uring.New(8) // bound to this thread
			if err != nil {
				t.Error(err)
				return
			}
			lp.call(func() {
				if lp.batchIO.ring == nil {
					_ = foreign.Close()
					return
				}
				_ = lp.batchIO.ring.Close()
				lp.batchIO.ring = foreign
			})
		}
	}()
	want := map[string]bool{}
	for i := range clients {
		for j := range writes {
			want[fmt.Sprintf("w-%d-%d", i, j)] = true
		}
	}
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			c := gs.Client()
			for j := range writes {
				if !writeJob1(t, gs, c, l.Token, fmt.Sprintf("w-%d-%d", i, j)) {
					return
				}
				done.Add(1)
				if j == writes/2 {
					<-swapped // the rest after the swap
				}
			}
		})
	}
	wg.Wait()
	got := map[string]int{}
	for _, r := range up.take() {
		got[r[strings.LastIndex(r, "\r\n\r\n")+4:]]++
	}
	for body := range want {
		if got[body] != 1 {
			t.Errorf("the upstream got write %s %d times", body, got[body])
		}
	}
	if len(got) != len(want) {
		t.Errorf("the upstream got %d distinct writes, want %d", len(got), len(want))
	}
	if n := rings(); n != 0 {
		t.Skipf("%d loops still have a ring: this kernel does not bind a ring to its thread, so no failure was injected", n)
	}
}

// writeJob1 sends a fenced write of body to job:1 through gs with token,
// and reports an error unless it is answered 200; false when it got no
// answer at all.
func writeJob1(t *testing.T, gs *gateServer, c *http.Client, token fencing.Token, body string) bool {
	req, _ := http.NewRequest(http.MethodPut, gs.URL+"/jobs/1", strings.NewReader(body))
	req.Header.Set("Fencing-Token", tok(token))
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("write %q answered %d", body, resp.StatusCode)
	}
	return true
}

type logOutput func([]byte) (int, error)

func (f logOutput) Write(p []byte) (int, error) { return f(p) }

// TestLoopsSurviveAnOverflowingChunkSize: an upstream answer whose chunk
// size does not fit in 63 bits (2^63, with leading zeros too) cuts that
// answer off and nothing else: the same gate goes on answering.
func TestLoopsSurviveAnOverflowingChunkSize(t *testing.T) {
	for _, size := range []string{"8000000000000000", "800000000000000f", "00000008000000000000000"} {
		t.Run(size, func(t *testing.T) {
			gs := serveGateBefore(t, func(up net.Conn) {
				io.WriteString(up, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+size+"\r\nabc")
			})
			waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
			for i := range 2 {
				c, err := net.Dial("tcp", gs.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if _, err := io.ReadAll(resp.Body); err == nil {
					t.Fatalf("request %d: the body was relayed whole; want it cut off", i)
				}
			}
		})
	}
}

// TestLoopsAnswerABareLFHeadAtOnce: an upstream answer whose head ends its
// lines with a bare LF, on a connection the upstream keeps open, is
// refused at once (502), not waited on until the upstream timeout: such a
// head never ends in CRLF CRLF.
func TestLoopsAnswerABareLFHeadAtOnce(t *testing.T) {
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	c := dialGateBefore(t, func(up net.Conn) {
		_, _ = io.WriteString(up, "HTTP/1.1 200 OK\nContent-Length: 2\n\nok")
		<-hold // the connection stays open
	})
	if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // the upstream timeout is longer
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	wantRawProblem(t, resp, http.StatusBadGateway, "upstream-unavailable")
}

// TestLoopsReuseTheUpstreamConnectionUsedLast: after a burst opened
// several upstream connections, one client's requests in turn all go over
// one of them (the one used last, as nginx's keepalive and net/http pick),
// not round the whole pool: at low load the connection in use stays warm,
// and the surplus goes idle and is closed after upstreamIdle. Judged from
// the upstream's record of the connection each request came on.
func TestLoopsReuseTheUpstreamConnectionUsedLast(t *testing.T) {
	var (
		mu    sync.Mutex
		conns []string // the upstream connection (peer address) of each request
	)
	hold := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns = append(conns, r.RemoteAddr)
		mu.Unlock()
		if r.URL.Path == "/hold" {
			<-hold
		}
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{}), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })

	// A burst: burst reads held at the upstream at once, each on a client
	// connection and an upstream connection of its own.
	burst := 4 * loopCount(0, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := c.Get(gs.URL + "/hold")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		})
	}
	waitFor(t, "the burst to reach the upstream", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(conns) == burst
	})
	close(hold)
	wg.Wait()

	mu.Lock()
	conns = nil
	mu.Unlock()
	c := &http.Client{Transport: &http.Transport{}}
	for range 12 {
		resp, err := c.Get(gs.URL + "/one")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	used := map[string]bool{}
	for _, a := range conns {
		used[a] = true
	}
	if len(conns) != 12 || len(used) != 1 {
		t.Fatalf("12 requests in turn reached the upstream as %d requests over %d connections, want one connection: %v", len(conns), len(used), conns)
	}
}

// TestLoopsOption: ServerOptions.Loops sets how many event loops serve the
// listener (FENCEGATE_LOOPS), zero leaving it to loopCount; connections
// are dealt out to every loop, and each write reaches the upstream once,
// read from its record.
func TestLoopsOption(t *testing.T) {
	if got := loopCount(0, 8); got != 4 {
		t.Errorf("loopCount(0, 8) = %d, want 4 (one per two CPUs)", got)
	}
	if got := loopCount(0, 1); got != 1 {
		t.Errorf("loopCount(0, 1) = %d, want 1", got)
	}
	up, u, st, l := newLeasedUpstream(t)
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: st, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	const loops = 3
	gs := serveGateWith(t, g, ServerOptions{Loops: loops})
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	if n := len(gs.srv.engine().loops); n != loops {
		t.Fatalf("%d loops serve the listener, want %d", n, loops)
	}
	const clients = 2 * loops
	var conns []net.Conn
	for i := range clients {
		c, err := net.Dial("tcp", gs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		body := strconv.Itoa(i)
		if _, err := io.WriteString(c, "PUT /jobs/1 HTTP/1.1\r\nHost: g\r\nFencing-Token: "+tok(l.Token)+
			"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("write %d: %v %v", i, resp, err)
		}
		conns = append(conns, c)
	}
	for i, lp := range gs.srv.engine().loops {
		var n int
		lp.call(func() { n = len(lp.clients) })
		if n == 0 {
			t.Errorf("loop %d serves none of %d open connections", i, len(conns))
		}
	}
	got := up.take()
	seen := map[string]int{}
	for _, r := range got {
		seen[r[strings.LastIndex(r, "\r\n\r\n")+4:]]++
	}
	for i := range clients {
		if n := seen[strconv.Itoa(i)]; n != 1 {
			t.Errorf("write %d reached the upstream %d times, want once", i, n)
		}
	}
	if len(got) != clients {
		t.Errorf("the upstream got %d requests, want %d", len(got), clients)
	}
}
