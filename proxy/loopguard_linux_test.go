//go:build linux

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/syncbuf"
)

// TestLoopsContainAPanic: a panic in a loop's step (provoked by a test
// hook when a request for /boom is decided) closes that request's
// connection and nothing else: a keep-alive connection opened before goes
// on being served, as do new ones, by the same loops; the panic is
// counted and logged with the request's id. Were the panic not contained,
// the test binary would exit.
func TestLoopsContainAPanic(t *testing.T) {
	hook := func(c *loopConn) {
		if string(c.request.head.Target) == "/boom" {
			panic("provoked by the test")
		}
	}
	loopPanicHook.Store(&hook)
	t.Cleanup(func() { loopPanicHook.Store(nil) })

	up := newRawUpstream(t)
	u, _ := url.Parse("http://" + up.ln.Addr().String())
	var logs syncbuf.Buffer
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

// blockingStore admits only when a test lets it: its Admit waits for
// release. It has none of the fast admission paths, so the loops admit
// through it on a goroutine of their own.
type blockingStore struct {
	fencing.Store
	entered chan struct{}
	release chan struct{}
}

func (s *blockingStore) Admit(_ context.Context, r fencing.AdmitRequest) (fencing.Admission, error) {
	s.entered <- struct{}{}
	<-s.release
	// Admitted whatever became of the request's context (Close ends
	// it): a store that answered after all.
	return s.Store.Admit(context.Background(), r)
}

// TestLoopsWaitForTheirGoroutinesOnStop: Close while a write's admission
// is with the store returns only once that admission is done, and the
// write's place at the barrier is then left (the loop had stopped: the
// result found no loop to go on with, and was not dropped). Nothing
// reaches the upstream.
func TestLoopsWaitForTheirGoroutinesOnStop(t *testing.T) {
	up, u, st, l := newLeasedUpstream(t)
	bs := &blockingStore{Store: st, entered: make(chan struct{}, 1), release: make(chan struct{})}
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: bs, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	if gs.srv.loops.Load() == nil {
		t.Skip("no event loops on this listener")
	}
	c, err := net.Dial("tcp", gs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: %d\r\nContent-Length: 1\r\n\r\nx", l.Token); err != nil {
		t.Fatal(err)
	}
	<-bs.entered
	if n := g.InFlightResources(); n != 1 {
		t.Fatalf("%d resources in flight during the admission, want 1", n)
	}
	closed := make(chan struct{})
	go func() {
		_ = gs.srv.Close()
		close(closed)
	}()
	// Close cannot return before the admission does: it waits for it.
	// (This check catches an early return only when Close is quick
	// enough; the check of the barrier below catches it always: an
	// admission that ends after its loop stopped, untracked, finds no
	// loop to leave its place.)
	time.Sleep(10 * time.Millisecond)
	select {
	case <-closed:
		t.Fatal("Close returned while an admission of its loops was still with the store")
	default:
	}
	close(bs.release)
	<-closed
	if n := g.InFlightResources(); n != 0 {
		t.Fatalf("%d resources still in flight after Close returned; the admitted write's place was never left", n)
	}
	if got := up.take(); len(got) != 0 {
		t.Fatalf("the upstream got %q", got)
	}
}

// TestLoopClosesAConnectionItCannotWatch: when the loop cannot change a
// socket's epoll registration (here the client's socket is taken out of
// the loop's epoll set behind its back, so EPOLL_CTL_MOD fails with
// ENOENT when a write to the slow client blocks), the connection is
// closed at once rather than left to stall until its deadline.
func TestLoopClosesAConnectionItCannotWatch(t *testing.T) {
	arrived, removed := make(chan struct{}), make(chan struct{})
	gs := serveGateBefore(t, func(up net.Conn) {
		close(arrived)
		// The answer only once the client is out of the epoll set: a
		// write that blocked before would wait, watched, for a wake-up
		// the removal takes away, and nothing would close it.
		<-removed
		fmt.Fprintf(up, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", 64<<20)
		_, _ = io.Copy(up, &patternReader{n: 64 << 20})
	})
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	e := gs.srv.loops.Load()
	if e == nil {
		t.Skip("no event loops on this listener")
	}
	c, err := net.Dial("tcp", gs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: gate\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-arrived // the loop read the request: its connection is registered
	for _, l := range e.loops {
		l.call(func() {
			for lc := range l.clients {
				if err := l.p.Remove(lc.FD); err != nil {
					t.Errorf("taking the client out of the epoll set: %v", err)
				}
			}
		})
	}
	close(removed)
	// The client reads nothing until the gate has let go of its
	// connection: the gate's writes block, and a blocked write, which
	// cannot ask to be woken, closes it. (Were the failure ignored, the
	// connection would stay, stalled until its deadline, and this wait
	// would time out.)
	waitFor(t, "the loop to close the connection it cannot watch", func() bool {
		open := 0
		for _, l := range e.loops {
			l.call(func() { open += len(l.clients) })
		}
		return open == 0
	})
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	n, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection stalled (%d bytes read); want it closed", n)
	}
	if n >= 64<<20 {
		t.Fatalf("%d bytes relayed whole; want the connection closed when its write blocked", n)
	}
}
