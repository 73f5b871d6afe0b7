package proxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// h2way is how a test reaches a gate over HTTP/2: with prior knowledge in
// cleartext (h2c), or over TLS by ALPN (hostile_tls_test.go).
type h2way struct {
	opts   ServerOptions                       // what the gate's server needs for it
	scheme string                              // of the client's URLs and :scheme
	dial   func(addr string) (net.Conn, error) // a connection ready for the client preface
	client func() *http.Client                 // a client speaking HTTP/2 only
}

// h2cWay is HTTP/2 with prior knowledge on a cleartext listener (with its
// event loops, as the binary serves one).
func h2cWay() h2way {
	return h2way{
		opts:   ServerOptions{H2C: true},
		scheme: "http",
		dial:   func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) },
		client: h2client,
	}
}

// h2env is a gate reached by w in front of a recording upstream, and its
// address.
func h2env(t *testing.T, w h2way) (*env, string) {
	t.Helper()
	e := newEnv(t, testRules)
	s := serveGateWith(t, e.gate, w.opts)
	return e, s.Listener.Addr().String()
}

// h2client speaks HTTP/2 with prior knowledge (h2c) to addr.
func h2client() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// rawH2 is a raw HTTP/2 connection, framed by x/net/http2's Framer.
type rawH2 struct {
	c   net.Conn
	f   *http2.Framer
	enc *hpack.Encoder
	buf bytes.Buffer
	// scheme is the :scheme of block's requests (default http).
	scheme string
}

// dialH2 opens a raw HTTP/2 connection to addr by w.
func (w h2way) dialH2(t *testing.T, addr string) *rawH2 {
	t.Helper()
	c, err := w.dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	h := newRawH2(t, c)
	h.scheme = w.scheme
	return h
}

// newRawH2 starts HTTP/2 on c (cleartext, or TLS after ALPN h2): the
// client preface and an empty SETTINGS frame. c is closed when the test
// ends.
func newRawH2(t *testing.T, c net.Conn) *rawH2 {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	h := &rawH2{c: c, f: http2.NewFramer(c, c)}
	h.enc = hpack.NewEncoder(&h.buf)
	if err := h.f.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return h
}

// block is the HPACK block of a request's header fields.
func (h *rawH2) block(method, path string, extra ...string) []byte {
	h.buf.Reset()
	kv := append([]string{":method", method, ":scheme", cmp.Or(h.scheme, "http"), ":authority", "gate", ":path", path}, extra...)
	for i := 0; i+1 < len(kv); i += 2 {
		_ = h.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return bytes.Clone(h.buf.Bytes())
}

// drain reads frames until the connection ends or d passes, and reports
// whether the server closed it (GOAWAY or EOF) and the settings it sent.
func (h *rawH2) drain(d time.Duration) (closed bool, settings map[http2.SettingID]uint32) {
	settings = map[http2.SettingID]uint32{}
	_ = h.c.SetReadDeadline(time.Now().Add(d))
	for {
		fr, err := h.f.ReadFrame()
		if err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout()), settings
		}
		switch fr := fr.(type) {
		case *http2.GoAwayFrame:
			return true, settings
		case *http2.SettingsFrame:
			_ = fr.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil })
		}
	}
}

// serverSettings reads frames until the gate's first SETTINGS (not an
// acknowledgement) and returns its values; the test fails if none comes
// within d or the connection ends first.
func (h *rawH2) serverSettings(t *testing.T, d time.Duration) map[http2.SettingID]uint32 {
	t.Helper()
	_ = h.c.SetReadDeadline(time.Now().Add(d))
	for {
		fr, err := h.f.ReadFrame()
		if err != nil {
			t.Fatalf("no SETTINGS from the gate: %v", err)
		}
		if sf, ok := fr.(*http2.SettingsFrame); ok && !sf.IsAck() {
			settings := map[http2.SettingID]uint32{}
			_ = sf.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil })
			return settings
		}
	}
}

// flood sends n rounds of frames, round i written by frame on a framer
// (errors are the test's), many rounds to a write (and so to a TLS
// record), as a flooding client sends them: the gate reads the same frames
// as from one write each, at a fraction of the client's cost. It stops at
// the first write that fails: the gate closed the connection.
func (h *rawH2) flood(t *testing.T, n int, frame func(f *http2.Framer, i int) error) {
	t.Helper()
	var buf bytes.Buffer
	f := http2.NewFramer(&buf, nil)
	for i := range n {
		if err := frame(f, i); err != nil {
			t.Fatal(err)
		}
		if buf.Len() >= 64<<10 || i == n-1 {
			if _, err := h.c.Write(buf.Bytes()); err != nil {
				return
			}
			buf.Reset()
		}
	}
}

// floodFrames is how many frames a flood sends: twice the control frames
// (PING and SETTINGS acknowledgements) net/http's HTTP/2 server queues for
// a client that does not read before it closes the connection.
const floodFrames = 20000

// fenceWait bounds a fence: it tells a gate stuck on the connection from
// one still working through a flood, which on a busy machine under the race
// detector has taken 11 s for 50,000 frames.
const fenceWait = time.Minute

// fence sends a PING and reads frames until its ACK or the connection's
// end. The ACK shows the gate has handled every frame sent before the PING
// (a connection's frames are handled in order) and still answers; the end,
// that it closed the connection (GOAWAY or EOF), which bounds the abuse.
// Neither within d is t's error: the gate is stuck on the connection.
func (h *rawH2) fence(t *testing.T, d time.Duration) {
	t.Helper()
	mark := [8]byte{'f', 'e', 'n', 'c', 'e'}
	if err := h.f.WritePing(false, mark); err != nil {
		return // closed by the gate
	}
	_ = h.c.SetReadDeadline(time.Now().Add(d))
	for {
		fr, err := h.f.ReadFrame()
		if err != nil {
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("the gate neither answered a PING sent after the abuse nor closed the connection within %v", d)
			}
			return
		}
		switch fr := fr.(type) {
		case *http2.GoAwayFrame:
			return
		case *http2.PingFrame:
			if fr.IsAck() && fr.Data == mark {
				return
			}
		}
	}
}

// stillServes proves the gate serves a fresh client after an abuse.
func stillServes(t *testing.T, w h2way, addr string) {
	t.Helper()
	resp, err := w.client().Get(w.scheme + "://" + addr + "/health-of-gate")
	if err != nil {
		t.Fatalf("after the abuse, a fresh client is not served: %v", err)
	}
	resp.Body.Close()
}

// TestH2CStreamsAreJudgedLikeHTTP1: each HTTP/2 stream is judged, admitted
// and forwarded as an HTTP/1.1 request: a live token's write reaches the
// upstream, a stale one, a missing one and a non-canonical path do not.
// Over h2c here; over TLS in TestH2TLSStreamsAreJudgedLikeHTTP1.
func TestH2CStreamsAreJudgedLikeHTTP1(t *testing.T) { testH2StreamsJudged(t, h2cWay()) }

func testH2StreamsJudged(t *testing.T, w h2way) {
	e, addr := h2env(t, w)
	old := e.acquire("job:1", "a", time.Second)
	e.clock.Advance(2 * time.Second)
	live := e.acquire("job:1", "b", time.Minute)
	c := w.client()
	do := func(method, path, token, body string) *http.Response {
		req, _ := http.NewRequest(method, w.scheme+"://"+addr+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set(HeaderToken, token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("%s %s answered over HTTP/%d", method, path, resp.ProtoMajor)
		}
		return resp
	}
	if r := do("PUT", "/jobs/1", tok(live.Token), "live"); r.StatusCode != 200 {
		t.Fatalf("live write: %d", r.StatusCode)
	}
	for _, w := range []struct {
		path, token string
		status      int
	}{{"/jobs/1", tok(old.Token), 409}, {"/jobs/1", "", 428}, {"/jobs/%2e%2e/1", tok(live.Token), 400}} {
		if r := do("PUT", w.path, w.token, "refused"); r.StatusCode != w.status {
			t.Fatalf("PUT %s token %q: %d, want %d", w.path, w.token, r.StatusCode, w.status)
		}
	}
	got := e.up.requests()
	if len(got) != 1 || got[0].Body != "live" || got[0].Token != tok(live.Token) {
		t.Fatalf("upstream got %+v", got)
	}
}

// TestH2CIsOffByDefault: without H2C, a cleartext client's HTTP/2 preface
// gets no HTTP/2 and nothing reaches the upstream.
func TestH2CIsOffByDefault(t *testing.T) {
	e := newEnv(t, testRules)
	if resp, err := h2client().Get(e.gateSrv.URL + "/x"); err == nil {
		resp.Body.Close()
		t.Fatalf("h2c served without H2C: %s", resp.Proto)
	}
	if n := e.up.count(); n != 0 {
		t.Fatalf("upstream got %d requests", n)
	}
}

// TestHTTP2Abuse sends HTTP/2's own attacks with raw frames at an h2c
// gate: each is bounded (the connection refused or closed, or a flood of
// control frames handled in full with the gate still answering on the
// connection, see fence), no stream of it reaches the upstream (every
// write carries a stale token, or never completes its headers), and the
// gate goes on serving others. Over TLS (ALPN h2) in TestHTTP2AbuseTLS.
func TestHTTP2Abuse(t *testing.T) { testHTTP2Abuse(t, h2cWay()) }

func testHTTP2Abuse(t *testing.T, w h2way) {
	e, addr := h2env(t, w)
	stale := e.acquire("job:1", "a", time.Second)
	e.clock.Advance(2 * time.Second)
	live := e.acquire("job:1", "b", time.Minute)
	if _, err := e.store.Admit(context.Background(), fencing.AdmitRequest{Resource: "job:1", Token: live.Token}); err != nil {
		t.Fatal(err)
	}

	t.Run("concurrent streams capped", func(t *testing.T) {
		h := w.dialH2(t, addr)
		settings := h.serverSettings(t, 10*time.Second)
		if n, ok := settings[http2.SettingMaxConcurrentStreams]; !ok || n > DefaultMaxConcurrentStreams {
			t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d (sent %v), want at most %d", n, ok, DefaultMaxConcurrentStreams)
		}
	})
	t.Run("rapid reset", func(t *testing.T) {
		h := w.dialH2(t, addr)
		block := h.block("PUT", "/jobs/1", "fencing-token", tok(stale.Token), "content-length", "1")
		h.flood(t, 20000, func(f *http2.Framer, i int) error {
			id := uint32(1 + 2*i)
			if err := f.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
				return err
			}
			return f.WriteRSTStream(id, http2.ErrCodeCancel)
		})
		h.drain(2 * time.Second)
	})
	t.Run("CONTINUATION flood", func(t *testing.T) {
		h := w.dialH2(t, addr)
		if err := h.f.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h.block("PUT", "/jobs/1", "fencing-token", tok(live.Token))}); err != nil {
			t.Fatal(err)
		}
		filler := h.block("GET", "/", "x-filler", strings.Repeat("a", 4000))
		sent := 0
		for ; sent < 100000; sent++ {
			if h.f.WriteContinuation(1, false, filler) != nil {
				break
			}
		}
		if closed, _ := h.drain(5 * time.Second); !closed {
			t.Fatalf("the connection stays open after %d CONTINUATION frames", sent)
		}
	})
	t.Run("PING flood", func(t *testing.T) {
		h := w.dialH2(t, addr)
		// The fence shows the gate handled them all (or closed the
		// connection).
		var data [8]byte
		h.flood(t, floodFrames, func(f *http2.Framer, _ int) error { return f.WritePing(false, data) })
		h.fence(t, fenceWait)
	})
	t.Run("SETTINGS flood", func(t *testing.T) {
		h := w.dialH2(t, addr)
		h.flood(t, floodFrames, func(f *http2.Framer, i int) error {
			return f.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(i)})
		})
		h.fence(t, fenceWait)
	})
	t.Run("header list too large", func(t *testing.T) {
		h := w.dialH2(t, addr)
		big := h.block("PUT", "/jobs/1", "fencing-token", tok(live.Token), "x-big", strings.Repeat("b", 15000))
		if err := h.f.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: big, EndHeaders: true, EndStream: true}); err != nil {
			t.Fatal(err)
		}
		h.drain(2 * time.Second)
	})
	if got := e.up.requests(); len(got) != 0 {
		t.Fatalf("the upstream got %d requests from the abuse: %+v", len(got), got[0])
	}
	stillServes(t, w, addr)
}

// TestH2UpstreamWindowIsBounded: over HTTP/2 to the upstream, the gate
// lets the upstream send each stream's answer at most 64 KiB ahead of the
// client, whatever the client: a client that never reads makes the gate
// hold no more per request than an HTTP/1.1 upstream connection costs.
// Read from what the gate tells the upstream (its SETTINGS frame, the
// flow-control window the upstream must honour), on a raw upstream.
func TestH2UpstreamWindowIsBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan map[http2.SettingID]uint32, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
			got <- nil
			return
		}
		f := http2.NewFramer(c, c)
		for {
			fr, err := f.ReadFrame()
			if err != nil {
				got <- nil
				return
			}
			if s, ok := fr.(*http2.SettingsFrame); ok && !s.IsAck() {
				settings := map[http2.SettingID]uint32{}
				_ = s.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil })
				got <- settings
				return
			}
		}
	}()
	u, _ := url.Parse("http://" + ln.Addr().String())
	rules, err := ParseRules(testRules)
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Options{Upstream: u, UpstreamHTTP2: true, Store: memstore.New(memstore.Options{}), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveGate(t, g)
	go func() {
		if resp, err := srv.Client().Get(srv.URL + "/report"); err == nil {
			resp.Body.Close()
		}
	}()
	settings := <-got
	if settings == nil {
		t.Fatal("the gate sent no HTTP/2 SETTINGS to the upstream")
	}
	window, ok := settings[http2.SettingInitialWindowSize]
	if !ok {
		window = 65535 // the protocol's default, when none is sent
	}
	if window > upstreamStreamWindow {
		t.Fatalf("the gate lets the upstream send %d bytes a stream ahead of the client, want at most %d", window, upstreamStreamWindow)
	}
}
