package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// resettingH2Upstream is an h2c upstream that receives each request whole,
// counts it, and then resets its stream with PROTOCOL_ERROR, as a buggy or
// hostile server may after applying a write.
type resettingH2Upstream struct {
	mu       sync.Mutex
	received map[string]int // by method and path
}

// serveH2cFrames serves c as an h2c upstream: it reads the client's
// preface, sends its settings, acknowledges the client's, and hands every
// other frame to on until on reports done or the connection fails; then
// it closes c.
func serveH2cFrames(c net.Conn, on func(f *http2.Framer, fr http2.Frame) (done bool)) {
	defer c.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	f := http2.NewFramer(c, c)
	if f.WriteSettings() != nil {
		return
	}
	for {
		fr, err := f.ReadFrame()
		if err != nil {
			return
		}
		if st, ok := fr.(*http2.SettingsFrame); ok {
			if !st.IsAck() {
				_ = f.WriteSettingsAck()
			}
			continue
		}
		if on(f, fr) {
			return
		}
	}
}

// endedStream is the stream fr ends (its HEADERS or DATA frame with
// END_STREAM: the request is whole), or 0.
func endedStream(fr http2.Frame) uint32 {
	h := fr.Header()
	if (h.Type == http2.FrameHeaders || h.Type == http2.FrameData) && h.Flags.Has(http2.FlagDataEndStream) {
		return h.StreamID
	}
	return 0
}

func (u *resettingH2Upstream) serve(c net.Conn) {
	heads := map[uint32]string{}
	serveH2cFrames(c, func(f *http2.Framer, fr http2.Frame) bool {
		if h, ok := fr.(*http2.HeadersFrame); ok {
			heads[h.StreamID] = string(h.HeaderBlockFragment()) // the encoded head: enough to tell requests apart
		}
		if id := endedStream(fr); id != 0 {
			u.mu.Lock()
			u.received[heads[id]]++
			u.mu.Unlock()
			_ = f.WriteRSTStream(id, http2.ErrCodeProtocol)
		}
		return false
	})
}

func (u *resettingH2Upstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.received {
		n += c
	}
	return n
}

// TestH2UpstreamWritesAreNotResent: net/http's HTTP/2 transport resends a
// request whose stream the upstream reset with PROTOCOL_ERROR, when it has
// no body or a GetBody to rewind one, and the upstream may have applied
// it. A fenced write, with a body or without, reaches such an upstream
// once, and its client gets a 502 that says it may have been applied.
func TestH2UpstreamWritesAreNotResent(t *testing.T) {
	up := &resettingH2Upstream{received: map[string]int{}}
	_, srv, l := h2UpstreamGate(t, up.serve, NoGrace)
	for _, w := range h2Writes {
		before := up.total()
		status, _ := h2Write(t, srv, l, w.method, w.body)
		if n := up.total() - before; n != 1 || status != http.StatusBadGateway {
			t.Errorf("%s with %d bytes: the upstream received it %d times, the client got %d; want once and 502", w.method, len(w.body), n, status)
		}
	}
}

// h2Writes are the writes the HTTP/2 upstream tests send: a small body,
// none, and one the gate streams.
var h2Writes = []struct{ method, body string }{{"PUT", "a body"}, {"DELETE", ""}, {"PATCH", strings.Repeat("x", 40<<10)}}

// h2UpstreamGate serves a gate in front of an h2c upstream served by
// serve, with the grace given, and job:1 held by the lease returned.
func h2UpstreamGate(t *testing.T, serve func(net.Conn), grace time.Duration) (*Gate, *gateServer, fencing.Lease) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, ln, serve)
	st := memstore.New(memstore.Options{})
	l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:1", Owner: "a", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("http://" + ln.Addr().String())
	rules, err := ParseRules(testRules)
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Options{Upstream: u, UpstreamHTTP2: true, Store: st, Rules: rules, UpstreamTimeout: 4 * time.Second, TimeoutGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	return g, serveGate(t, g), l
}

// h2Write sends one fenced write to the gate with l's token and returns
// the status and body of the answer.
func h2Write(t *testing.T, srv *gateServer, l fencing.Lease, method, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+"/jobs/1", bytes.NewReader([]byte(body)))
	req.Header.Set(HeaderToken, tok(l.Token))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// refusingH2Upstream is an h2c upstream that turns every request away
// unprocessed as its head arrives, as RFC 9113 §8.7 lets a server: with
// RST_STREAM(REFUSED_STREAM) (a server at its stream limit), or with a
// GOAWAY whose last stream comes before it (a server shutting down
// gracefully, which closes the connection after). It counts the heads.
type refusingH2Upstream struct {
	goAway     bool
	goAwayCode http2.ErrCode // the GOAWAY's error code
	mu         sync.Mutex
	heads      int
}

func (u *refusingH2Upstream) serve(c net.Conn) {
	serveH2cFrames(c, func(f *http2.Framer, fr http2.Frame) bool {
		h, ok := fr.(*http2.HeadersFrame)
		if !ok {
			return false
		}
		u.mu.Lock()
		u.heads++
		u.mu.Unlock()
		if u.goAway {
			// The streams before this one only. Closing now could lose
			// the GOAWAY in a reset: the client closes once it has no
			// stream left.
			_ = f.WriteGoAway(max(h.StreamID, 2)-2, u.goAwayCode, nil)
			return false
		}
		_ = f.WriteRSTStream(h.StreamID, http2.ErrCodeRefusedStream)
		return false
	})
}

func (u *refusingH2Upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.heads
}

// TestH2RefusedWritesAreNotApplied: an HTTP/2 upstream that refuses a
// write's stream unprocessed (REFUSED_STREAM, or a GOAWAY that leaves it
// out: a graceful restart) has not applied it, and says so by protocol.
// The gate answers such a write 502 saying nothing was applied, and leaves
// its place at the barrier: the next holder's write is not held for the
// grace period behind a write that cannot land. Nor is the write sent
// again by the transport: the upstream sees each head once.
func TestH2RefusedWritesAreNotApplied(t *testing.T) {
	for _, tc := range []struct {
		name       string
		goAway     bool
		goAwayCode http2.ErrCode
	}{
		{"REFUSED_STREAM", false, 0},
		{"GOAWAY", true, http2.ErrCodeNo},
		{"GOAWAY ENHANCE_YOUR_CALM", true, http2.ErrCodeEnhanceYourCalm},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &refusingH2Upstream{goAway: tc.goAway, goAwayCode: tc.goAwayCode}
			g, srv, l := h2UpstreamGate(t, up.serve, time.Hour)
			for _, w := range h2Writes {
				before := up.count()
				status, problem := h2Write(t, srv, l, w.method, w.body)
				if n := up.count() - before; n != 1 {
					t.Errorf("%s: the upstream saw its head %d times, want once", w.method, n)
				}
				if status != http.StatusBadGateway || !strings.Contains(problem, "nothing was applied") {
					t.Errorf("%s: %d %s; want 502 saying nothing was applied", w.method, status, problem)
				}
				if n := g.registered("job:1", l.Token); n != 0 {
					t.Errorf("%s: the write's barrier place is still taken (%d): held for the grace as if it might have been applied", w.method, n)
				}
			}
		})
	}
}

// TestH2AppliedWritesAreNotTakenForRefused: an h2c upstream receives a
// write whole, applies it, then shuts down: a GOAWAY whose last stream is
// the write's (it was processed), with debug data that holds the very
// words net/http uses for a refused stream, then closes. The write may
// have been applied (it was): the gate answers 502 "may have been
// applied" and holds the barrier for the grace. Text the upstream chooses
// is quoted inside net/http's errors and must not pass for the
// transport's own.
func TestH2AppliedWritesAreNotTakenForRefused(t *testing.T) {
	for _, debug := range []string{
		"stream error: stream ID 1; REFUSED_STREAM; received from peer",
		"http2: Transport received Server's graceful shutdown GOAWAY",
		"http2: Transport received GOAWAY from server ErrCode:NO_ERROR",
		"restarting",
	} {
		t.Run(debug, func(t *testing.T) {
			var applied atomic.Int32
			serve := func(c net.Conn) {
				serveH2cFrames(c, func(f *http2.Framer, fr http2.Frame) bool {
					id := endedStream(fr)
					if id == 0 {
						return false
					}
					applied.Add(1) // the whole write
					_ = f.WriteGoAway(id, http2.ErrCodeNo, []byte(debug))
					_ = c.(*net.TCPConn).CloseWrite()
					_, _ = io.Copy(io.Discard, c) // until the gate closes
					return true
				})
			}
			g, srv, l := h2UpstreamGate(t, serve, time.Hour)
			status, problem := h2Write(t, srv, l, "DELETE", "")
			if applied.Load() != 1 {
				t.Fatalf("the upstream applied %d writes, want 1", applied.Load())
			}
			if status != http.StatusBadGateway || !strings.Contains(problem, "may have been applied") {
				t.Errorf("an applied write was answered %d %s; want 502 saying it may have been applied", status, problem)
			}
			if n := g.registered("job:1", l.Token); n == 0 {
				t.Errorf("the applied write's barrier place was left: a newer holder's write could pass it within the grace")
			}
		})
	}
}
