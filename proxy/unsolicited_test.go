package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestUnsolicitedBytesAreNeverAnAnswer: an upstream whose first answer
// carries a complete second response after it (bytes no request asked
// for) must not have those bytes read as a later request's answer, on
// either engine: the connection they arrived on is dropped, not reused, and
// the next request gets its own answer from the upstream.
//
// The event loops check a pooled connection before they reuse it, so the
// next request follows at once. The general engine has net/http's
// transport, which reads an idle connection ahead and drops it when bytes
// arrive unasked; a request that takes the connection in the instant
// between its return to the pool and that read (a goroutine descheduled
// there, on a busy machine) can still get them (docs/gate.md, What the
// service receives): there the next request waits until the upstream has
// seen the poisoned connection closed.
func TestUnsolicitedBytesAreNeverAnAnswer(t *testing.T) {
	for _, noLoops := range []bool{false, true} {
		name := map[bool]string{false: "event loops", true: "general engine"}[noLoops]
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			var answered, conns atomic.Int64
			var secondOn atomic.Int64   // the upstream connection the second request came on
			var firstClosed atomic.Bool // the upstream's first connection was closed by the gate
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					conn := conns.Add(1)
					go func() {
						defer c.Close()
						br := bufio.NewReader(c)
						for {
							req, err := http.ReadRequest(br)
							if err != nil {
								if conn == 1 {
									firstClosed.Store(true)
								}
								return
							}
							_, _ = io.Copy(io.Discard, req.Body)
							n := answered.Add(1)
							if n == 2 {
								secondOn.Store(conn)
							}
							answer := "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nanswer"
							if n == 1 {
								answer += "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
							}
							if _, err := io.WriteString(c, answer); err != nil {
								return
							}
						}
					}()
				}
			}()
			u, _ := url.Parse("http://" + ln.Addr().String())
			g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{}), UpstreamConns: 1})
			if err != nil {
				t.Fatal(err)
			}
			gate := serveGateWith(t, g, ServerOptions{NoEventLoops: noLoops})
			client := &http.Client{Timeout: 10 * time.Second}
			for i := range 3 {
				resp, err := client.Get(gate.URL + "/r")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(body) != "answer" {
					t.Fatalf("request %d got %q: bytes no request asked for were read as its answer", i, body)
				}
				if i == 0 && noLoops {
					waitFor(t, "the poisoned upstream connection closed", firstClosed.Load)
				}
			}
			if n := answered.Load(); n != 3 {
				t.Fatalf("the upstream answered %d requests, want 3 (each its own)", n)
			}
			if c := secondOn.Load(); c == 1 {
				t.Fatal("the connection that carried unsolicited bytes was reused")
			}
		})
	}
}
