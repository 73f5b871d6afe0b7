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
	defer c.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	f := http2.NewFramer(c, c)
	if err := f.WriteSettings(); err != nil {
		return
	}
	for {
		fr, err := f.ReadFrame()
		if err != nil {
			return
		}
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				_ = f.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			u.mu.Lock()
			u.heads++
			u.mu.Unlock()
			if u.goAway {
				_ = f.WriteGoAway(max(fr.StreamID, 2)-2, u.goAwayCode, nil) // the streams before this one only
				// Closing now could lose the GOAWAY in a reset: the
				// client closes once it has no stream left.
				continue
			}
			_ = f.WriteRSTStream(fr.StreamID, http2.ErrCodeRefusedStream)
		}
	}
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
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			up := &refusingH2Upstream{goAway: tc.goAway, goAwayCode: tc.goAwayCode}
			serveOn(t, ln, up.serve)
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
			g, err := New(Options{Upstream: u, UpstreamHTTP2: true, Store: st, Rules: rules, UpstreamTimeout: 4 * time.Second, TimeoutGrace: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			srv := serveGate(t, g)
			for _, w := range []struct{ method, body string }{{"PUT", "a body"}, {"DELETE", ""}, {"PATCH", strings.Repeat("x", 40<<10)}} {
				before := up.count()
				req, _ := http.NewRequest(w.method, srv.URL+"/jobs/1", bytes.NewReader([]byte(w.body)))
				req.Header.Set(HeaderToken, tok(l.Token))
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				problem, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if n := up.count() - before; n != 1 {
					t.Errorf("%s: the upstream saw its head %d times, want once", w.method, n)
				}
				if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(problem), "nothing was applied") {
					t.Errorf("%s: %d %s; want 502 saying nothing was applied", w.method, resp.StatusCode, problem)
				}
				if n := g.registered("job:1", l.Token); n != 0 {
					t.Errorf("%s: the write's barrier place is still taken (%d): held for the grace as if it might have been applied", w.method, n)
				}
			}
		})
	}
}
