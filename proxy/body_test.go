package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/problem"
)

// rawExchange sends raw bytes to addr, half-closes the connection when
// closeWrite is set, and returns the gate's answer (nil when the gate closed
// the connection without one).
func rawExchange(t *testing.T, addr, raw string, closeWrite bool) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	if closeWrite {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

func wantRawProblem(t *testing.T, resp *http.Response, status int, code string) string {
	t.Helper()
	if resp == nil {
		t.Fatalf("no answer, want %d %s", status, code)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != problem.ContentType ||
		!strings.Contains(string(b), `"code":"`+code+`"`) {
		t.Fatalf("got %d %s %s, want %d %s", resp.StatusCode, resp.Header.Get("Content-Type"), b, status, code)
	}
	return string(b)
}

// TestStalledBodyIsCutOff: an admitted write whose body streams (past
// BodyBuffer) and that sends 4 of 100 body bytes and stalls is cut off at
// the body deadline and answered 408 body-timeout; its resource stays held
// for the grace (part of it reached the upstream), then opens.
func TestStalledBodyIsCutOff(t *testing.T) {
	for _, grace := range []time.Duration{time.Hour, 50 * time.Millisecond} {
		t.Run(grace.String(), func(t *testing.T) {
			e := newEnv(t, testRules, func(o *Options) {
				o.BodyBuffer = -1 // stream every body
				o.BodyTimeout = 100 * time.Millisecond
				o.BarrierTimeout = 20 * time.Millisecond
				o.TimeoutGrace = grace
			})
			a := e.acquire("job:1", "a", 10*time.Second)
			e.clock.Advance(11 * time.Second)
			b := e.acquire("job:1", "b", 10*time.Second)
			addr := strings.TrimPrefix(e.gateSrv.URL, "http://")
			resp := rawExchange(t, addr, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: "+tok(a.Token)+
				"\r\nContent-Length: 100\r\n\r\nabcd", false)
			detail := wantRawProblem(t, resp, http.StatusRequestTimeout, "body-timeout")
			if !strings.Contains(detail, "barrier stays closed") {
				t.Fatalf("the answer does not say the barrier is held: %s", detail)
			}
			if grace == time.Hour {
				if n := e.gate.InFlightResources(); n != 1 {
					t.Fatalf("barrier holds %d resources after a cut-off write, want 1", n)
				}
				wantProblem(t, e.do("PUT", "/jobs/1", "newer", HeaderToken, tok(b.Token)), 503, "barrier-timeout")
				for _, g := range e.up.requests() {
					if g.Token == tok(b.Token) {
						t.Fatal("the higher token was forwarded during the hold")
					}
				}
				return
			}
			waitFor(t, "the hold to end", func() bool { return e.gate.InFlightResources() == 0 })
			if r := e.do("PUT", "/jobs/1", "newer", HeaderToken, tok(b.Token)); r.Status != 200 {
				t.Fatalf("after the hold: %d %s", r.Status, r.Body)
			}
		})
	}
}

// TestSmallBodyIsReadBeforeAdmission: a body within BodyBuffer is read in
// full before the write is admitted. A client that stalls it, before or
// after its first byte, or ends it early, is answered (408 body-timeout,
// 400 invalid-body) without the write being admitted, forwarded or holding
// the barrier: the next holder's write goes straight through.
func TestSmallBodyIsReadBeforeAdmission(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		closeWrite bool
		status     int
		code       string
	}{
		{"stalled before the body", "", false, http.StatusRequestTimeout, "body-timeout"},
		{"stalled mid-body", "abcd", false, http.StatusRequestTimeout, "body-timeout"},
		{"ended early", "abcd", true, http.StatusBadRequest, "invalid-body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules, func(o *Options) {
				o.BodyTimeout = 100 * time.Millisecond
				o.TimeoutGrace = time.Hour
			})
			a := e.acquire("job:1", "a", 10*time.Second)
			addr := strings.TrimPrefix(e.gateSrv.URL, "http://")
			resp := rawExchange(t, addr, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: "+tok(a.Token)+
				"\r\nContent-Length: 100\r\n\r\n"+tc.body, tc.closeWrite)
			detail := wantRawProblem(t, resp, tc.status, tc.code)
			if !strings.Contains(detail, "nothing was forwarded") {
				t.Fatalf("the answer does not say nothing was forwarded: %s", detail)
			}
			if n := e.gate.InFlightResources(); n != 0 {
				t.Fatalf("barrier holds %d resources, want 0", n)
			}
			if n := e.up.count(); n != 0 {
				t.Fatalf("upstream got %d requests, want 0", n)
			}
			if r := e.do("PUT", "/jobs/1", "next", HeaderToken, tok(a.Token)); r.Status != 200 {
				t.Fatalf("the next write: %d %s", r.Status, r.Body)
			}
		})
	}
}

// TestBodyTimeoutCountsFromForwarding: the body deadline starts when the
// write is forwarded, not when it arrived: a write that waited at the
// barrier longer than the deadline, with its body complete, goes through.
func TestBodyTimeoutCountsFromForwarding(t *testing.T) {
	e := newEnv(t, testRules, func(o *Options) { o.BodyTimeout = 50 * time.Millisecond })
	_, b, res1, release := e.slowHandoff()
	res2 := make(chan response, 1)
	go func() {
		r, _ := doReq(e.client, e.gateSrv.URL, "PUT", "/jobs/5", "two", HeaderToken, tok(b.Token))
		res2 <- r
	}()
	waitFor(t, "write two parked", func() bool { return e.gate.registered("job:5", b.Token) == 1 })
	time.Sleep(200 * time.Millisecond) // past the body deadline while parked
	close(release)
	if r := <-res1; r.Status != 200 {
		t.Fatalf("write one: %d %s", r.Status, r.Body)
	}
	if r := <-res2; r.Status != 200 {
		t.Fatalf("write two, parked past the body deadline: %d %s", r.Status, r.Body)
	}
}

// TestClientBodyErrors: a body the client breaks (chunk size out of range,
// bare LF in the chunk framing, fewer bytes than Content-Length then the
// end of its stream) is the client's error: 400 invalid-body, not 502
// upstream-unavailable. A body broken in its first piece is refused before
// anything is sent (no hold); one broken later was cut off after the
// request's headers reached the upstream, so the barrier is held for the
// grace as for any write that may have been applied.
func TestClientBodyErrors(t *testing.T) {
	for _, tc := range []struct {
		name, framing string
		closeWrite    bool
		sent          int // requests the upstream saw, and resources held
	}{
		{"chunk size too large", "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff1\r\nabcd\r\n0\r\n\r\n", false, 0},
		{"bare LF in chunk framing", "Transfer-Encoding: chunked\r\n\r\n4\nabcd\n0\n\n", false, 0},
		{"chunk size too large after a first chunk", "Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\nffffffffffffffffff1\r\nabcd\r\n0\r\n\r\n", false, 1},
		{"body shorter than Content-Length", "Content-Length: 100\r\n\r\nabcd", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules, func(o *Options) { o.TimeoutGrace, o.BodyBuffer = time.Hour, -1 })
			l := e.acquire("job:1", "a", 10*time.Second)
			addr := strings.TrimPrefix(e.gateSrv.URL, "http://")
			resp := rawExchange(t, addr, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: "+tok(l.Token)+"\r\n"+tc.framing, tc.closeWrite)
			detail := wantRawProblem(t, resp, http.StatusBadRequest, "invalid-body")
			if strings.Contains(detail, "upstream-unavailable") {
				t.Fatalf("reported as an upstream failure: %s", detail)
			}
			if n := e.gate.InFlightResources(); n != tc.sent {
				t.Fatalf("barrier holds %d resources, want %d", n, tc.sent)
			}
			if n := e.up.count(); tc.sent == 0 && n != 0 {
				t.Fatalf("upstream saw %d requests of a body refused unsent", n)
			}
		})
	}
}

// TestNoGrace: with NoGrace an ambiguous outcome does not hold the barrier.
func TestNoGrace(t *testing.T) {
	e := newEnv(t, testRules, func(o *Options) {
		o.BodyBuffer = -1
		o.TimeoutGrace = NoGrace
		o.BodyTimeout = 50 * time.Millisecond
	})
	l := e.acquire("job:1", "a", 10*time.Second)
	addr := strings.TrimPrefix(e.gateSrv.URL, "http://")
	resp := rawExchange(t, addr, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: "+tok(l.Token)+"\r\nContent-Length: 100\r\n\r\nabcd", false)
	wantRawProblem(t, resp, http.StatusRequestTimeout, "body-timeout")
	waitFor(t, "the barrier to empty", func() bool { return e.gate.InFlightResources() == 0 })
	u, _ := url.Parse(e.upSrv.URL)
	if g, err := New(Options{Upstream: u, Store: e.store}); err != nil || g.grace != DefaultTimeoutGrace {
		t.Fatalf("zero TimeoutGrace: %v %v", g.grace, err)
	}
}

// TestSlowHeadIsCutOff: a client that sends part of a head and stalls is
// answered 408 at the header deadline and its connection closed, while
// another client's write goes through meanwhile.
func TestSlowHeadIsCutOff(t *testing.T) {
	e := newEnv(t, testRules)
	s := serveGateWith(t, e.gate, ServerOptions{HeaderTimeout: 300 * time.Millisecond})
	l := e.acquire("job:1", "a", time.Minute)
	started := time.Now()
	answer := make(chan *http.Response, 1)
	go func() {
		answer <- rawExchange(t, s.Listener.Addr().String(), "PUT /jobs/1 HTTP/1.1\r\nHost: ga", false)
	}()
	if r, _ := doReq(e.client, s.URL, "PUT", "/jobs/1", "x", HeaderToken, tok(l.Token)); r.Status != 200 {
		t.Fatalf("a write beside the slow head: %d %s", r.Status, r.Body)
	}
	wantRawProblem(t, <-answer, http.StatusRequestTimeout, "invalid-request")
	if d := time.Since(started); d > 10*time.Second {
		t.Fatalf("the slow head was answered after %v", d)
	}
	if n := e.up.count(); n != 1 {
		t.Fatalf("upstream got %d requests, want 1", n)
	}
}

// TestHalfCloseAfterAWholeWrite: a client that half-closes its connection
// once its whole request is sent (nc -N, HTTP/1.0 tools) still gets the
// upstream's answer, and its write leaves the barrier at that answer: the
// half-close is not taken for a client gone, which would answer 502 for a
// write the upstream applied and hold the resource for the grace. On the
// general engine (a chunked body, HTTP/1.0), with the half-close before
// and after the write reached the upstream. Read from the upstream's
// record and the next holder's answer.
func TestHalfCloseAfterAWholeWrite(t *testing.T) {
	for _, c := range []struct{ name, head, body string }{
		{"chunked", "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\n", "2\r\nhc\r\n0\r\n\r\n"},
		{"HTTP/1.0", "PUT /jobs/1 HTTP/1.0\r\nHost: gate\r\nContent-Length: 2\r\n", "hc"},
	} {
		for _, atUpstream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, half-closed at the upstream %v", c.name, atUpstream), func(t *testing.T) {
				e := newEnv(t, testRules, func(o *Options) {
					o.BarrierTimeout = 50 * time.Millisecond
					o.TimeoutGrace = time.Hour
				})
				arrived, release := make(chan struct{}), make(chan struct{})
				e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
					if rec.Body == "hc" && atUpstream {
						close(arrived)
						<-release
					}
					return false
				}
				a := e.acquire("job:1", "a", 10*time.Second)
				e.clock.Advance(11 * time.Second)
				b := e.acquire("job:1", "b", 10*time.Second)
				conn, err := net.Dial("tcp", e.gateSrv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				if _, err := io.WriteString(conn, c.head+"Fencing-Token: "+tok(a.Token)+"\r\n\r\n"+c.body); err != nil {
					t.Fatal(err)
				}
				if atUpstream {
					<-arrived
				}
				_ = conn.(*net.TCPConn).CloseWrite()
				if atUpstream {
					close(release)
				}
				_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					t.Fatalf("no answer after the half-close: %v", err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(body) != "applied hc" {
					t.Fatalf("answer %d %q, want the upstream's 200", resp.StatusCode, body)
				}
				if r := e.do("PUT", "/jobs/1", "next", HeaderToken, tok(b.Token)); r.Status != http.StatusOK {
					t.Fatalf("the next holder after a half-closed write: %d %s", r.Status, r.Body)
				}
				got := e.up.requests()
				if len(got) != 2 || got[0].Body != "hc" || got[1].Body != "next" {
					t.Fatalf("the upstream got %+v, want the half-closed write, then the next holder's", got)
				}
			})
		}
	}
}

// TestEarlyAnswerEndsTheConnection: an upstream that answers a streamed
// (chunked) write before reading its body may never get the rest of it;
// the answer then closes the client's connection, so what the client
// sends next (the rest of its chunks, or anything else) is never taken
// for a new request and forwarded. Judged from the upstream's record, on
// both engines (the loops hand a chunked body to the general engine).
func TestEarlyAnswerEndsTheConnection(t *testing.T) {
	for _, loops := range []bool{false, true} {
		t.Run(fmt.Sprintf("loops %v", loops), func(t *testing.T) {
			e := newEnv(t, testRules)
			var mu sync.Mutex
			var got []string
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				got = append(got, r.Method+" "+r.URL.Path)
				mu.Unlock()
				// The answer before the body is read (net/http would read
				// it first, unless full duplex).
				_ = http.NewResponseController(w).EnableFullDuplex()
				w.WriteHeader(http.StatusAccepted)
			}))
			defer up.Close()
			u, _ := url.Parse(up.URL)
			g, err := New(Options{Upstream: u, Store: e.store, Rules: e.gateOpts.Rules})
			if err != nil {
				t.Fatal(err)
			}
			srv := serveGateWith(t, g, ServerOptions{NoEventLoops: !loops})
			a := e.acquire("job:1", "a", 10*time.Second)
			for _, next := range []string{
				"GET /smuggled-raw HTTP/1.1\r\nHost: gate\r\n\r\n",
				"31\r\nGET /smuggled-in-chunk HTTP/1.1\r\nHost: gate\r\n\r\n\r\n0\r\n\r\n",
			} {
				conn, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
				if _, err := io.WriteString(conn, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\nFencing-Token: "+tok(a.Token)+"\r\n\r\n5\r\nfirst\r\n"); err != nil {
					t.Fatal(err)
				}
				br := bufio.NewReader(conn)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("no answer: %v", err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					t.Fatalf("the early answer: %d, want the upstream's 202", resp.StatusCode)
				}
				if !resp.Close {
					t.Errorf("the early answer does not say Connection: close")
				}
				_, _ = io.WriteString(conn, next) // may fail: the gate closed
				if resp, err := http.ReadResponse(br, nil); err == nil {
					resp.Body.Close()
					t.Errorf("after the early answer, the bytes %q got an answer of their own: %d", next, resp.StatusCode)
				}
				conn.Close()
			}
			time.Sleep(100 * time.Millisecond) // anything forwarded has arrived
			mu.Lock()
			defer mu.Unlock()
			for _, r := range got {
				if strings.Contains(r, "smuggled") {
					t.Fatalf("the upstream got %v: bytes sent after an early answer were forwarded as a request", got)
				}
			}
			if len(got) != 2 {
				t.Fatalf("the upstream got %v, want the two writes", got)
			}
		})
	}
}

// TestEmptyWritesReachTheUpstreamAlike: a fenced PUT with an empty body
// reaches an HTTP/1.1 upstream framed alike (Content-Length: 0, not an
// empty chunked body) whether its client spoke HTTP/1.1 or HTTP/2.
func TestEmptyWritesReachTheUpstreamAlike(t *testing.T) {
	e := newEnv(t, testRules)
	var mu sync.Mutex
	var seen []string
	e.up.handle = func(w http.ResponseWriter, r *http.Request, _ received) bool {
		mu.Lock()
		seen = append(seen, strings.Join(r.TransferEncoding, ",")+"|"+r.Header.Get("Content-Length"))
		mu.Unlock()
		return false
	}
	s := serveGateWith(t, e.gate, ServerOptions{H2C: true})
	l := e.acquire("job:1", "a", time.Hour)
	for _, c := range []*http.Client{s.Client(), h2client()} {
		req, _ := http.NewRequest("PUT", s.URL+"/jobs/1", http.NoBody)
		req.Header.Set(HeaderToken, tok(l.Token))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0] != seen[1] {
		t.Fatalf("upstream framing (Transfer-Encoding|Content-Length): HTTP/1.1 client %q, HTTP/2 client %q; want the same", seen[0], seen[1])
	}
}
