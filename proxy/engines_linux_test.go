//go:build linux

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

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
	{"head refused, then a read", "HEAD /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r32\r\nX-HTTP-Method-Override: PUT\r\n\r\nGET /r HTTP/1.1\r\nHost: gate\r\nX-Request-Id: r33\r\n\r\n"},
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
	// The fields a write is judged by go to the upstream whatever the
	// client's Connection names (the Destination under the base path).
	{"connection names the destination token", "COPY /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: d1\r\nFencing-Token: 1\r\nFencing-Destination-Token: 2\r\nDestination: /jobs/2\r\nConnection: Fencing-Destination-Token\r\nContent-Length: 0\r\n\r\n"},
	{"connection names the destination", "MOVE /jobs/1 HTTP/1.1\r\nHost: gate\r\nX-Request-Id: d2\r\nFencing-Token: 1\r\nFencing-Destination-Token: 2\r\nDestination: /jobs/2\r\nConnection: Destination, Fencing-Token\r\nContent-Length: 0\r\n\r\n"},
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
// event loops and one served by the general engine alone, and finds the
// same bytes at the upstream and the same answers at the client.
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
						t.Errorf("answers differ\n%s:\n%s\ngeneral engine:\n%s", kind, strings.Join(got, "\n"), strings.Join(want, "\n"))
					}
					if len(want) == 0 {
						t.Error("no answer at all")
					}
					gotUp, wantUp := canonicalRequests(t, loops.up.take()), canonicalRequests(t, plain.up.take())
					if strings.Join(gotUp, "\n--\n") != strings.Join(wantUp, "\n--\n") {
						t.Errorf("the upstream got different requests\n%s:\n%q\ngeneral engine:\n%q", kind, gotUp, wantUp)
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
// the event loops and on the general engine.
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
// general engine.
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
