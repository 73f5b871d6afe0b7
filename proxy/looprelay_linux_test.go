//go:build linux

package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestBytesPastABodyReadToItsEndAreSeen: an upstream that sends bytes past
// its answer's Content-Length body, in the same write as the body's end
// (the head came in a read of its own), never has them taken for the next
// client's answer: the relay reads the body to its end and not past it,
// so it looks for more before the connection goes back to the pool.
// Judged by what a second client gets, on one upstream connection.
func TestBytesPastABodyReadToItsEndAreSeen(t *testing.T) {
	for _, size := range []int{10, 100000} {
		for _, noRing := range []bool{false, true} {
			t.Run(strconv.Itoa(size)+map[bool]string{false: " bytes, io_uring", true: " bytes, plain I/O"}[noRing], func(t *testing.T) {
				first := strings.Repeat("x", size)
				var conns atomic.Int32
				up := serveRaw(t, func(up net.Conn) {
					conns.Add(1)
					defer up.Close()
					br := bufio.NewReader(up)
					for {
						req, err := http.ReadRequest(br)
						if err != nil {
							return
						}
						if req.URL.Path != "/first" {
							io.WriteString(up, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ngood")
							continue
						}
						io.WriteString(up, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(size)+"\r\n\r\n")
						time.Sleep(100 * time.Millisecond) // the head is read alone
						io.WriteString(up, first+"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL")
					}
				})
				u, _ := url.Parse("http://" + up.Addr().String())
				g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{})})
				if err != nil {
					t.Fatal(err)
				}
				gs := serveGateWith(t, g, ServerOptions{NoIOURing: noRing})
				waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
				get := func(path string) string {
					c, err := net.Dial("tcp", gs.Listener.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					_ = c.SetDeadline(time.Now().Add(10 * time.Second))
					io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: gate\r\n\r\n")
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						return "no answer: " + err.Error()
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					return string(b)
				}
				if got := get("/first"); got != first {
					t.Fatalf("the first answer: %d bytes, want %d", len(got), size)
				}
				if got := get("/second"); got != "good" {
					t.Fatalf("the second client got %q (upstream connections: %d), want its own answer: bytes past the first answer were taken for it", got, conns.Load())
				}
			})
		}
	}
}
