//go:build linux

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/fencegate/fencegate/fencing/problem"
)

// TestH2StreamsPerClient: with MaxConnsPerClient 8 (so 4 HTTP/2 requests
// in flight per client), one client holds 4 streams whose fenced writes
// stall their bodies one byte short. Its fifth stream, a write that would
// raise another resource's mark, is answered at once, 503
// too-many-connections with Retry-After, problem+json: not forwarded, the
// mark not raised. Meanwhile its HTTP/1.1 write is served (the connection
// caps bound those), and another client's write over HTTP/2 is admitted
// and forwarded. Once the stalled bodies complete, their writes are
// forwarded, and the count of streams returns to zero. With and without
// the event loops.
func TestH2StreamsPerClient(t *testing.T) {
	for _, loops := range []bool{true, false} {
		t.Run(fmt.Sprintf("loops %v", loops), func(t *testing.T) {
			e := newEnv(t, testRules, func(o *Options) { o.BodyTimeout = time.Minute })
			srv := serveGateWith(t, e.gate, ServerOptions{H2C: true, NoEventLoops: !loops, MaxConns: 64, MaxConnsPerClient: 8})
			addr := srv.Listener.Addr().String()
			inFlight := func() int64 { return srv.srv.streams.c.Active() }
			client := func(ip net.IP) *http.Client {
				tr := &http.Transport{Protocols: new(http.Protocols)}
				tr.Protocols.SetUnencryptedHTTP2(true)
				tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).DialContext
				t.Cleanup(tr.CloseIdleConnections)
				return &http.Client{Transport: tr, Timeout: 20 * time.Second}
			}
			forwarded := func(body string) bool {
				for _, r := range e.up.requests() {
					if r.Body == body {
						return true
					}
				}
				return false
			}
			held := e.acquire("job:1", "a", time.Hour)
			other := e.acquire("job:2", "a", time.Hour)
			third := e.acquire("job:3", "b", time.Hour)

			// The raw client below reads no answers: they are kept short,
			// within its HTTP/2 receive window.
			e.up.handle = func(w http.ResponseWriter, _ *http.Request, _ received) bool { return true }

			// Four stalled streams from hostileIP: its share.
			c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: hostileIP}}).Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			h := newRawH2(t, c)
			body := strings.Repeat("s", 16<<10)
			for i := range 4 {
				id := uint32(1 + 2*i)
				blk := h.block("PUT", "/jobs/1", "content-length", fmt.Sprint(len(body)), "fencing-token", tok(held.Token))
				if err := h.f.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: blk, EndHeaders: true}); err != nil {
					t.Fatal(err)
				}
				if err := h.f.WriteData(id, false, []byte(body[:len(body)-1])); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "4 streams in flight", func() bool { return inFlight() == 4 })

			// Its fifth, over HTTP/2: refused at once.
			r, err := doReq(client(hostileIP), "http://"+addr, "PUT", "/jobs/2", "past the share", HeaderToken, tok(other.Token))
			if err != nil {
				t.Fatal(err)
			}
			wantProblem(t, r, http.StatusServiceUnavailable, "too-many-connections")
			if r.Header.Get("Retry-After") != "1" || r.Header.Get("Content-Type") != problem.ContentType {
				t.Errorf("refusal's headers: %v", r.Header)
			}
			if d, _ := r.Problem["detail"].(string); !strings.Contains(d, "HTTP/2 requests") {
				t.Errorf("refusal's detail: %q", d)
			}
			if st, err := e.store.Status(context.Background(), "job:2"); err != nil || st.HighWater >= other.Token {
				t.Errorf("job:2 after the refusal: %+v %v: its mark was raised", st, err)
			}
			if forwarded("past the share") {
				t.Error("the refused stream's write reached the upstream")
			}

			// Its HTTP/1.1 write is served.
			c1, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: hostileIP}}).Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c1.Close()
			resp := roundTrip(t, c1, bufio.NewReader(c1), "PUT /jobs/2 HTTP/1.1\r\nHost: gate\r\nConnection: close\r\nFencing-Token: "+
				tok(other.Token)+"\r\nContent-Length: 6\r\n\r\nover 1")
			if resp.StatusCode != 200 || !forwarded("over 1") {
				t.Errorf("HTTP/1.1 write from the client at its share: %d, forwarded %v", resp.StatusCode, forwarded("over 1"))
			}

			// Another client's write over HTTP/2 goes through.
			r, err = doReq(client(otherIP), "http://"+addr, "PUT", "/jobs/3", "from another client", HeaderToken, tok(third.Token))
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != 200 || !forwarded("from another client") {
				t.Errorf("another client's write: %d %q, forwarded %v", r.Status, r.Body, forwarded("from another client"))
			}

			// The stalled bodies complete: their writes are forwarded,
			// and the streams leave the count.
			for i := range 4 {
				if err := h.f.WriteData(uint32(1+2*i), true, []byte(body[len(body)-1:])); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "the stalled writes forwarded", func() bool {
				n := 0
				for _, r := range e.up.requests() {
					if r.Body == body {
						n++
					}
				}
				return n == 4
			})
			waitFor(t, "no stream in flight", func() bool { return inFlight() == 0 })
			if total, perClient := srv.srv.streams.c.Refused(); total != 0 || perClient != 1 {
				t.Errorf("streams refused: total %d, per client %d; want 0 and 1", total, perClient)
			}
		})
	}
}

// TestH2StreamsInAll: with MaxConns 8 (so 2 HTTP/2 requests in flight in
// all, a quarter), two clients' stalled streams fill the gate, and a third client's
// stream is refused, 503 too-many-connections, not forwarded.
func TestH2StreamsInAll(t *testing.T) {
	e := newEnv(t, testRules, func(o *Options) { o.BodyTimeout = time.Minute })
	srv := serveGateWith(t, e.gate, ServerOptions{H2C: true, NoEventLoops: true, MaxConns: 8})
	addr := srv.Listener.Addr().String()
	lease := e.acquire("job:1", "a", time.Hour)
	for i, ip := range []net.IP{hostileIP, otherIP} {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		h := newRawH2(t, c)
		blk := h.block("PUT", "/jobs/1", "content-length", "2", "fencing-token", tok(lease.Token))
		if err := h.f.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := h.f.WriteData(1, false, []byte("x")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("%d streams in flight", i+1), func() bool { return srv.srv.streams.c.Active() == int64(i+1) })
	}
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)}}).DialContext
	defer tr.CloseIdleConnections()
	r, err := doReq(&http.Client{Transport: tr, Timeout: 20 * time.Second}, "http://"+addr, "PUT", "/jobs/1", "past the cap", HeaderToken, tok(lease.Token))
	if err != nil {
		t.Fatal(err)
	}
	wantProblem(t, r, http.StatusServiceUnavailable, "too-many-connections")
	if n := e.up.count(); n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
	if total, perClient := srv.srv.streams.c.Refused(); total != 1 || perClient != 0 {
		t.Errorf("streams refused: total %d, per client %d; want 1 and 0", total, perClient)
	}
}

// TestH2ReceiveWindows: the gate's HTTP/2 server grants each stream
// h2StreamWindow and each connection h2ConnWindow of DATA ahead of its
// reads, not net/http's 1 MiB each.
func TestH2ReceiveWindows(t *testing.T) {
	e := newEnv(t, testRules)
	srv := serveGateWith(t, e.gate, ServerOptions{H2C: true})
	h := h2cWay().dialH2(t, srv.Listener.Addr().String())
	if got := h.serverSettings(t, 10*time.Second)[http2.SettingInitialWindowSize]; got != h2StreamWindow {
		t.Errorf("stream window %d, want %d", got, h2StreamWindow)
	}
	_ = h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		fr, err := h.f.ReadFrame()
		if err != nil {
			t.Fatalf("no connection WINDOW_UPDATE: %v", err)
		}
		if wu, ok := fr.(*http2.WindowUpdateFrame); ok && wu.StreamID == 0 {
			if got := 65535 + int(wu.Increment); got != h2ConnWindow {
				t.Errorf("connection window %d, want %d", got, h2ConnWindow)
			}
			return
		}
	}
}
