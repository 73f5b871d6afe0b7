//go:build linux

package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Stalls is one h2c connection that opens streams, each a fenced write
// whose body stops one byte short, framed by hand: one goroutine writes,
// one reads, whatever the number of streams (net/http's client takes two
// per stream, past what the race detector allows at this scale). It keeps
// to the connection's flow-control window, acknowledges the gate's
// SETTINGS and returns the window of the answers it reads.
type h2Stalls struct {
	c   net.Conn
	f   *http2.Framer
	wmu sync.Mutex // the framer's writes

	mu      sync.Mutex
	changed *sync.Cond // window grew, an answer ended, a PING came back, the connection ended
	window  int64      // the connection's send window
	answers map[uint32]*h2Answer
	pings   int
	err     error // the connection's end
}

// h2Answer is what the gate answered on a stream.
type h2Answer struct {
	status int
	header http.Header
	body   bytes.Buffer
	done   bool // END_STREAM or RST_STREAM
}

// dialH2Stalls opens an h2c connection to addr from ip, closed when t
// ends.
func dialH2Stalls(t *testing.T, ip net.IP, addr string) *h2Stalls {
	t.Helper()
	c := dialFrom(t, ip, addr)
	h := &h2Stalls{c: c, f: http2.NewFramer(c, c), window: 65535, answers: map[uint32]*h2Answer{}}
	h.changed = sync.NewCond(&h.mu)
	h.f.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := h.f.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go h.read()
	return h
}

func (h *h2Stalls) write(f func(*http2.Framer) error) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	return f(h.f)
}

func (h *h2Stalls) read() {
	for {
		fr, err := h.f.ReadFrame()
		h.mu.Lock()
		if err != nil {
			h.err = err
			h.changed.Broadcast()
			h.mu.Unlock()
			return
		}
		id := fr.Header().StreamID
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				_ = h.write(func(f *http2.Framer) error { return f.WriteSettingsAck() })
			}
		case *http2.WindowUpdateFrame:
			if id == 0 {
				h.window += int64(fr.Increment)
			}
		case *http2.PingFrame:
			if fr.IsAck() {
				h.pings++
			}
		case *http2.MetaHeadersFrame:
			a := h.answer(id)
			if st, err := strconv.Atoi(fr.PseudoValue("status")); err == nil && st >= 200 {
				a.status, a.header = st, http.Header{}
				for _, hf := range fr.RegularFields() {
					a.header.Add(hf.Name, hf.Value)
				}
			}
			a.done = a.done || fr.StreamEnded()
		case *http2.DataFrame:
			a := h.answer(id)
			a.body.Write(fr.Data())
			a.done = a.done || fr.StreamEnded()
			if n := uint32(len(fr.Data())); n > 0 {
				_ = h.write(func(f *http2.Framer) error {
					if err := f.WriteWindowUpdate(0, n); err != nil {
						return err
					}
					return f.WriteWindowUpdate(id, n)
				})
			}
		case *http2.RSTStreamFrame:
			h.answer(id).done = true
		case *http2.GoAwayFrame:
			h.err = fmt.Errorf("GOAWAY %v", fr.ErrCode)
		}
		h.changed.Broadcast()
		h.mu.Unlock()
	}
}

// answer is stream id's answer; h.mu is held.
func (h *h2Stalls) answer(id uint32) *h2Answer {
	a := h.answers[id]
	if a == nil {
		a = &h2Answer{}
		h.answers[id] = a
	}
	return a
}

// open sends streams fenced writes (streams 1, 3, 5...) with the headers
// of block and len(body)-1 bytes of body each, waiting for the window as
// it must; an answered stream gets no more DATA.
func (h *h2Stalls) open(streams int, block func() []byte, body []byte) error {
	for i := range streams {
		id := uint32(1 + 2*i)
		if err := h.write(func(f *http2.Framer) error {
			return f.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(), EndHeaders: true})
		}); err != nil {
			return err
		}
		part := body[:len(body)-1]
		h.mu.Lock()
		for h.window < int64(len(part)) && h.err == nil && !h.answer(id).done {
			h.changed.Wait()
		}
		skip := h.err != nil || h.answer(id).done
		if !skip {
			h.window -= int64(len(part))
		}
		h.mu.Unlock()
		if skip {
			continue
		}
		if err := h.write(func(f *http2.Framer) error { return f.WriteData(id, false, part) }); err != nil {
			return err
		}
	}
	return nil
}

// fence sends a PING and waits for its ACK: the gate has then handled
// every frame sent before it (a connection's frames are handled in order).
func (h *h2Stalls) fence(d time.Duration) error {
	h.mu.Lock()
	want := h.pings + 1
	h.mu.Unlock()
	if err := h.write(func(f *http2.Framer) error { return f.WritePing(false, [8]byte{'f'}) }); err != nil {
		return err
	}
	return h.await(d, "the PING's ACK", func() bool { return h.pings >= want })
}

// finish sends the last byte of every stream not yet answered.
func (h *h2Stalls) finish(t *testing.T, body []byte) {
	t.Helper()
	h.mu.Lock()
	var open []uint32
	for id, a := range h.answers {
		if !a.done {
			open = append(open, id)
		}
	}
	h.mu.Unlock()
	for _, id := range open {
		if err := h.write(func(f *http2.Framer) error { return f.WriteData(id, true, body[len(body)-1:]) }); err != nil {
			t.Fatal(err)
		}
	}
}

// await waits up to d for cond, read under h.mu.
func (h *h2Stalls) await(d time.Duration, what string, cond func() bool) error {
	timer := time.AfterFunc(d, func() { h.mu.Lock(); h.changed.Broadcast(); h.mu.Unlock() })
	defer timer.Stop()
	deadline := time.Now().Add(d)
	h.mu.Lock()
	defer h.mu.Unlock()
	for !cond() {
		if h.err != nil {
			return fmt.Errorf("waiting for %s: the connection ended: %w", what, h.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s within %v", what, d)
		}
		h.changed.Wait()
	}
	return nil
}

// TestH2StalledBodiesStayBounded: over h2c, with the default caps
// (FENCEGATE_MAX_CONNS 4096, a quarter of it per client address, half of
// those for HTTP/2 requests), one client address opens 40 connections of
// 128 streams, every stream a fenced write whose 16 KiB body
// (FENCEGATE_BODY_BUFFER's default: read in full before admission) stalls
// one byte short: 5,120 streams. The address gets its share, 512 streams;
// the 4,608 beyond are answered at once, 503 too-many-connections with
// Retry-After, nothing forwarded; the gate's RSS stays under the 128 MiB
// memory limit the deploy manifests give the sidecar (measured without
// their GOMEMLIMIT, which would only make the collector work harder near
// it). Meanwhile another client's fenced write over h2c is admitted and
// forwarded. Once their bodies complete, the held writes are forwarded
// too.
func TestH2StalledBodiesStayBounded(t *testing.T) {
	const (
		conns, streams = 40, 128
		share          = 512 // half FENCEGATE_MAX_CONNS_PER_CLIENT's default
		bound          = 128 << 20
	)
	var forwarded atomic.Int64
	var mu sync.Mutex
	var workerWrites []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/jobs/2" {
			mu.Lock()
			workerWrites = append(workerWrites, r.Header.Get("Fencing-Token")+" "+string(b))
			mu.Unlock()
			return
		}
		forwarded.Add(1)
	}))
	defer up.Close()
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + up.URL,
		"FENCEGATE_PROXY_H2C=true", "FENCEGATE_BODY_TIMEOUT=2m"}, "gate", "api")
	pid := p.cmd.Process.Pid
	idle, err := procStatus(pid, "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(resource string) string {
		code, lease, _ := call(t, "POST", p.url("api", "/v1/leases/"+resource+"/acquire"), nil, `{"owner":"w","ttl_seconds":600}`)
		if code != 200 {
			t.Fatalf("acquire: %d %v", code, lease)
		}
		return fmt.Sprint(token(t, lease))
	}
	tk := acquire("r")
	body := []byte(strings.Repeat("b", 16<<10))

	var peak atomic.Int64
	sample := func() {
		if rss, err := procStatus(pid, "VmRSS"); err == nil && rss > peak.Load() {
			peak.Store(rss)
		}
	}
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-sampling:
				return
			case <-time.After(10 * time.Millisecond):
				sample()
			}
		}
	}()

	// Every connection sends its streams, then a PING: once each PING
	// is acknowledged, the gate has every stream's headers and body but
	// its last byte (the body deadline, 2 minutes, answers none
	// meanwhile).
	var hs []*h2Stalls
	var wg sync.WaitGroup
	for range conns {
		h := dialH2Stalls(t, hostileIP, p.addr["gate"])
		hs = append(hs, h)
		wg.Go(func() {
			var buf bytes.Buffer
			enc := hpack.NewEncoder(&buf)
			block := func() []byte {
				buf.Reset()
				for _, kv := range [][2]string{{":method", "PUT"}, {":scheme", "http"}, {":authority", "gate"}, {":path", "/jobs/1"},
					{"content-length", strconv.Itoa(len(body))}, {"fencing-resource", "r"}, {"fencing-token", tk}} {
					_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
				}
				return bytes.Clone(buf.Bytes())
			}
			if err := h.open(streams, block, body); err != nil {
				t.Error(err)
				return
			}
			if err := h.fence(90 * time.Second); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// A while more, for the handlers to take in what the connections
	// have read.
	for range 100 {
		sample()
		time.Sleep(10 * time.Millisecond)
	}
	close(sampling)
	<-sampled

	// Another client's write, over h2c, during the flood.
	wtk := acquire("w")
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: workerIP}}).DialContext
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("PUT", "http://"+p.addr["gate"]+"/jobs/2", strings.NewReader("from the worker"))
	req.Header.Set("Fencing-Resource", "w")
	req.Header.Set("Fencing-Token", wtk)
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("the worker's write during the flood: %v", err)
	}
	resp.Body.Close()
	mu.Lock()
	got := slices.Clone(workerWrites)
	mu.Unlock()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 || !slices.Equal(got, []string{wtk + " from the worker"}) {
		t.Errorf("the worker's write during the flood: %s %d; the upstream got %q", resp.Proto, resp.StatusCode, got)
	}

	var refused, held int
	for _, h := range hs {
		h.mu.Lock()
		for _, a := range h.answers {
			switch {
			case !a.done:
				held++
			case a.status == 503 && a.header.Get("Retry-After") != "" && a.header.Get("Content-Type") == "application/problem+json" &&
				strings.Contains(a.body.String(), `"too-many-connections"`):
				refused++
			default:
				t.Errorf("a stream answered %d %v %q before its body was whole", a.status, a.header, a.body.String())
			}
		}
		h.mu.Unlock()
	}
	t.Logf("idle RSS %.1f MiB; %d streams (%d connections x %d) with stalled %d-byte bodies: %d held, %d refused; peak RSS %.1f MiB",
		float64(idle)/(1<<20), conns*streams, conns, streams, len(body), held, refused, float64(peak.Load())/(1<<20))
	if peak.Load() > bound {
		t.Errorf("the gate's RSS reached %.1f MiB with %d streams holding stalled buffered bodies, past %d MiB", float64(peak.Load())/(1<<20), held, bound>>20)
	}
	if held != share {
		t.Errorf("%d streams held, want %d: the address's share", held, share)
	}
	if n := forwarded.Load(); n != 0 {
		t.Errorf("%d writes forwarded before any body was whole", n)
	}

	// The held writes complete, and are forwarded.
	for _, h := range hs {
		h.finish(t, body)
	}
	for _, h := range hs {
		if err := h.await(2*time.Minute, "every answer", func() bool {
			for _, a := range h.answers {
				if !a.done {
					return false
				}
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n := forwarded.Load(); n != int64(held) {
		t.Errorf("%d writes forwarded, want the %d held ones", n, held)
	}
}
