//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/memstore"
)

// syncBuffer is a log output tests read while the gate writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLoopsContainAPanic: a panic in a loop's step (provoked by a test
// hook when a request for /boom is decided) closes that request's
// connection and nothing else: a keep-alive connection opened before goes
// on being served, as do new ones, by the same loops; the panic is
// counted and logged with the request's id. Were the panic not contained,
// the test binary would exit.
func TestLoopsContainAPanic(t *testing.T) {
	hook := func(c *loopConn) {
		if string(c.ctx.Request.URI().Path()) == "/boom" {
			panic("provoked by the test")
		}
	}
	loopPanicHook.Store(&hook)
	t.Cleanup(func() { loopPanicHook.Store(nil) })

	up := newRawUpstream(t)
	u, _ := url.Parse("http://" + up.ln.Addr().String())
	var logs syncBuffer
	g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{}), Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	if gs.srv.loops.Load() == nil {
		t.Skip("no event loops on this listener")
	}
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", gs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	get := func(c net.Conn, br *bufio.Reader, path, id string) (*http.Response, error) {
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: gate\r\nX-Request-Id: "+id+"\r\n\r\n"); err != nil {
			return nil, err
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
		}
		return resp, err
	}
	other, otherR := dial()
	if resp, err := get(other, otherR, "/before", "before-1"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("before the panic: %v %v", resp, err)
	}

	victim, victimR := dial()
	if resp, err := get(victim, victimR, "/boom", "boom-1"); err == nil {
		t.Fatalf("the request that panicked was answered %d; want its connection closed", resp.StatusCode)
	}

	// The connection opened before, and a new one, are served.
	if resp, err := get(other, otherR, "/after", "after-1"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the other connection after the panic: %v %v", resp, err)
	}
	fresh, freshR := dial()
	if resp, err := get(fresh, freshR, "/after", "after-2"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a new connection after the panic: %v %v", resp, err)
	}
	if n := g.tel.panics.Load(); n != 1 {
		t.Fatalf("%d panics counted, want 1", n)
	}
	var line string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "contained a panic") {
			line = l
		}
	}
	if !strings.Contains(line, `"request_ids":["boom-1"]`) || !strings.Contains(line, "provoked by the test") {
		t.Fatalf("the panic's log line %q does not name its cause and request id; log:\n%s", line, logs.String())
	}
	got := strings.Join(up.take(), "")
	if strings.Contains(got, "/boom") || !strings.Contains(got, "/after") {
		t.Fatalf("the upstream got:\n%s", got)
	}
}
