//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/evloop"
)

// TestUpstreamConnsAreSharedByTheLoops: UpstreamConns caps the upstream
// connections of all the loops together, and each loop keeps its own idle
// ones. A request on a loop that finds the cap reached while another
// loop holds an idle connection must get that place, not wait for the
// other loop to close it after upstreamIdle (a minute) or give up at the
// upstream timeout with "no free upstream connection". Two client
// connections land on two loops (accepted connections go round), with
// UpstreamConns 1: the first leaves the one connection idle on its loop,
// the second must be answered by the upstream. Both engines, and several
// turns, so that the place moves back and forth.
func TestUpstreamConnsAreSharedByTheLoops(t *testing.T) {
	var got atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		fmt.Fprint(w, "answer "+r.URL.Path)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	for _, noLoops := range []bool{false, true} {
		name := map[bool]string{false: "event loops", true: "general engine"}[noLoops]
		t.Run(name, func(t *testing.T) {
			got.Store(0)
			// An upstream timeout far beyond the test's own deadline: a
			// request left waiting fails the test by the deadline below,
			// not with the gate's own answer.
			g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{}), UpstreamConns: 1,
				UpstreamTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			gate := serveGateWith(t, g, ServerOptions{Loops: 2, NoEventLoops: noLoops})
			if !noLoops {
				waitFor(t, "the event loops", func() bool { return gate.srv.engine() != nil })
				if n := gate.srv.engine().count(); n != 2 {
					t.Fatalf("the gate runs %d event loops, want 2", n)
				}
			}
			var conns [2]net.Conn
			var readers [2]*bufio.Reader
			for i := range conns {
				c, err := net.Dial("tcp", gate.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				conns[i], readers[i] = c, bufio.NewReader(c)
			}
			for turn := range 6 {
				i := turn % 2 // alternate between the two loops
				path := fmt.Sprintf("/r%d", turn)
				c := conns[i]
				if err := c.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
					t.Fatal(err)
				}
				if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: gate\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(readers[i], nil)
				if err != nil {
					t.Fatalf("turn %d (client connection %d): %v: the request waited for an upstream connection another loop kept idle", turn, i, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(body) != "answer "+path {
					t.Fatalf("turn %d (client connection %d): %d %q, want 200 %q", turn, i, resp.StatusCode, body, "answer "+path)
				}
			}
			if n := got.Load(); n != 6 {
				t.Fatalf("the upstream received %d requests, want 6", n)
			}
		})
	}
}

// TestUpstreamConnsCapUnderLoad: many clients over two loops share
// UpstreamConns places: every request is answered by the upstream, which
// never has more requests of the gate's at once than the cap (one a
// connection), while the places move between the loops (reserve,
// reclaim). Connections the gate closed can stay open at the upstream a
// moment longer (until it reads their end), so the upstream counts
// requests in progress, not connections.
func TestUpstreamConnsCapUnderLoad(t *testing.T) {
	const maxConns, clients, each = 3, 24, 15
	var busy, most, got atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := busy.Add(1)
		defer busy.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		got.Add(1)
		time.Sleep(time.Millisecond) // requests overlap
		fmt.Fprint(w, "answer "+r.URL.Path)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{}), UpstreamConns: maxConns,
		UpstreamTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	gate := serveGateWith(t, g, ServerOptions{Loops: 2})
	errs := make(chan error, clients)
	for i := range clients {
		go func() {
			errs <- func() error {
				c, err := net.Dial("tcp", gate.Listener.Addr().String())
				if err != nil {
					return err
				}
				defer c.Close()
				if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
					return err
				}
				br := bufio.NewReader(c)
				for j := range each {
					path := fmt.Sprintf("/c%d-%d", i, j)
					if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: gate\r\n\r\n"); err != nil {
						return err
					}
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						return fmt.Errorf("%s: %w", path, err)
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK || string(body) != "answer "+path {
						return fmt.Errorf("%s: %d %q", path, resp.StatusCode, body)
					}
				}
				return nil
			}()
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := got.Load(); n != clients*each {
		t.Fatalf("the upstream received %d requests, want %d", n, clients*each)
	}
	if m := most.Load(); m > maxConns {
		t.Fatalf("the upstream had %d requests at once, over UpstreamConns %d", m, maxConns)
	}
	if m := most.Load(); m < 2 {
		t.Fatalf("the upstream had at most %d request at once: the load never needed a second place", m)
	}
}

// TestUpstreamPlacesAreCountedThroughRetries: a read whose pooled
// connection breaks is sent again on a new connection, which takes a
// place of its own after the broken one gave its place back. Over many
// such retries the engine's count of places in use must stay the number
// of connections it holds: one that drifted down would let the gate open
// more than UpstreamConns, one that drifted up would make requests wait
// for places nobody holds. The upstream answers the first request on each
// connection and hangs up on the second, once it has read it.
func TestUpstreamPlacesAreCountedThroughRetries(t *testing.T) {
	var answered atomic.Int64
	ln := serveRaw(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		answered.Add(1)
		body := "answer " + req.URL.Path
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
			return
		}
		_, _ = http.ReadRequest(br) // then hang up without an answer
	})
	u, _ := url.Parse("http://" + ln.Addr().String())
	g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{}), UpstreamConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	gate := serveGateWith(t, g, ServerOptions{Loops: 1})
	client := &http.Client{Timeout: 20 * time.Second}
	const requests = 20
	for i := range requests {
		path := fmt.Sprintf("/r%d", i)
		resp, err := client.Get(gate.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "answer "+path {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, body)
		}
	}
	if n := answered.Load(); n != requests {
		t.Fatalf("the upstream answered %d requests, want %d", n, requests)
	}
	e := gate.srv.engine()
	var idle int
	e.loops[0].call(func() { idle = len(e.loops[0].pool.idle) })
	if n := e.upConns.Load(); n != int64(idle) || idle != 1 {
		t.Fatalf("%d places counted in use, %d connections idle; want 1 and 1", n, idle)
	}
}

// TestReclaimClosesOnlyThePlacesNeeded: a loop whose requests wait at the
// UpstreamConns cap asks the other loops for n places; they close n idle
// connections in all, asked one after another, not up to n each. Four
// loops, two idle connections (socket pairs standing in for upstream
// connections) on each of the other three, three places asked for: the
// first loop asked closes its two, the second one (its longest idle), the
// third none.
func TestReclaimClosesOnlyThePlacesNeeded(t *testing.T) {
	g, err := New(Options{Upstream: &url.URL{Scheme: "http", Host: "127.0.0.1:9"}, Store: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGateWith(t, g, ServerOptions{Loops: 4})
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	e := gs.srv.engine()
	if len(e.loops) != 4 {
		t.Fatalf("%d loops, want 4", len(e.loops))
	}
	idleOn := func(lp *eventLoop) (n int) {
		lp.call(func() { n = len(lp.pool.idle) })
		return n
	}
	for _, lp := range e.loops[1:] {
		for range 2 {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(fds[1]) })
			lp.call(func() {
				e.upConns.Add(1)
				lp.pool.put(&upConn{Sock: evloop.Sock{FD: fds[0]}, l: lp})
			})
		}
	}
	requester := e.loops[0]
	requester.call(func() { requester.pool.reclaim(3) })
	waitFor(t, "three idle connections closed", func() bool { return e.upConns.Load() <= 3 })
	for range 2 { // what the loops were asked is done when their inboxes are
		for _, lp := range e.loops {
			lp.call(func() {})
		}
	}
	var got []int
	for _, lp := range e.loops[1:] {
		got = append(got, idleOn(lp))
	}
	if want := []int{0, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("idle connections left on the other loops: %v, want %v", got, want)
	}
	if n := e.upConns.Load(); n != 3 {
		t.Errorf("%d places in use, want 3", n)
	}
}
