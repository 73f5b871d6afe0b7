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

func (u *resettingH2Upstream) serve(c net.Conn) {
	defer c.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	f := http2.NewFramer(c, c)
	f.ReadMetaHeaders = nil
	if err := f.WriteSettings(); err != nil {
		return
	}
	heads := map[uint32]string{}
	for {
		fr, err := f.ReadFrame()
		if err != nil {
			return
		}
		var id uint32
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				_ = f.WriteSettingsAck()
			}
			continue
		case *http2.HeadersFrame:
			heads[fr.StreamID] = string(fr.HeaderBlockFragment()) // the encoded head: enough to tell requests apart
			if !fr.StreamEnded() {
				continue
			}
			id = fr.StreamID
		case *http2.DataFrame:
			if !fr.StreamEnded() {
				continue
			}
			id = fr.StreamID
		default:
			continue
		}
		u.mu.Lock()
		u.received[heads[id]]++
		u.mu.Unlock()
		_ = f.WriteRSTStream(id, http2.ErrCodeProtocol)
	}
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	up := &resettingH2Upstream{received: map[string]int{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go up.serve(c)
		}
	}()
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
	g, err := New(Options{Upstream: u, UpstreamHTTP2: true, Store: st, Rules: rules, UpstreamTimeout: 4 * time.Second, TimeoutGrace: NoGrace})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveGate(t, g)
	for _, w := range []struct{ method, body string }{{"PUT", "a body"}, {"DELETE", ""}, {"PATCH", strings.Repeat("x", 40<<10)}} {
		before := up.total()
		req, _ := http.NewRequest(w.method, srv.URL+"/jobs/1", bytes.NewReader([]byte(w.body)))
		req.Header.Set(HeaderToken, tok(l.Token))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n := up.total() - before; n != 1 || resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%s with %d bytes: the upstream received it %d times, the client got %d; want once and 502", w.method, len(w.body), n, resp.StatusCode)
		}
	}
}
