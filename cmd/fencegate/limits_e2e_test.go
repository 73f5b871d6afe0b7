package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSlowClientsAreBounded: 2,000 connections send a lease-API body at one
// byte a second, against a cap of 1,000 connections. Those past the cap are
// ended at once (answered 503 too-many-connections where the answer
// arrives before the reset); those within it are closed by the body
// deadline; /readyz, asked on a new connection every 100 ms,
// answers 200 throughout.
func TestSlowClientsAreBounded(t *testing.T) {
	const (
		clients       = 2000
		maxConns      = 1000
		headerTimeout = time.Second
		bodyTimeout   = 2 * time.Second
	)
	p := start(t, t.TempDir(), []string{
		// Every client here is 127.0.0.1: the per-client share is off so
		// that the total cap and its reserve are what is tested.
		"FENCEGATE_STORE=memory:", "FENCEGATE_MAX_CONNS=1000", "FENCEGATE_MAX_CONNS_PER_CLIENT=0",
		"FENCEGATE_READ_HEADER_TIMEOUT=" + headerTimeout.String(), "FENCEGATE_BODY_TIMEOUT=" + bodyTimeout.String(),
	}, "api")
	addr := p.addr["api"]

	type outcome struct {
		refused bool          // answered 503 too-many-connections
		closed  time.Duration // when the server closed the connection, after it was opened
		err     error
	}
	outcomes := make(chan outcome, clients)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ended atomic.Int64 // slow clients whose connection the server ended
	for range clients {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				outcomes <- outcome{err: err}
				return
			}
			defer c.Close()
			start := time.Now()
			_, err = io.WriteString(c, "POST /v1/leases/slow/acquire HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")

			var answer []byte
			buf := make([]byte, 4096)
			for err == nil {
				select {
				case <-stop:
					outcomes <- outcome{err: errors.New("still open when the test gave up")}
					return
				default:
				}
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				var n int
				n, err = c.Read(buf)
				answer = append(answer, buf[:n]...)
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					_, err = io.WriteString(c, " ") // one more byte a second
					if err != nil && len(answer) == 0 {
						break // closed by the server
					}
				}
			}
			ended.Add(1)
			outcomes <- outcome{refused: strings.Contains(string(answer), "too-many-connections"), closed: time.Since(start)}
		})
	}

	// Once the burst beyond the cap is refused (the connections in the
	// reserve as soon as their headers are read), /readyz keeps answering
	// while the slow clients hold their places.
	settle := time.Now().Add(30 * time.Second)
	for ended.Load() < clients-maxConns {
		if time.Now().After(settle) {
			close(stop)
			t.Fatalf("only %d connections past the cap were ended", ended.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline := time.Now().Add(headerTimeout + bodyTimeout + time.Second)
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	probes := 0
	for time.Now().Before(deadline) {
		resp, err := probe.Get(p.url("api", "/readyz"))
		if err != nil {
			close(stop)
			t.Fatalf("/readyz under load: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			close(stop)
			t.Fatalf("/readyz under load: %d %s", resp.StatusCode, b)
		}
		probes++
		time.Sleep(100 * time.Millisecond)
	}

	timer := time.AfterFunc(30*time.Second, func() { close(stop) })
	wg.Wait()
	timer.Stop()
	close(outcomes)
	refused := 0
	var latest time.Duration
	for o := range outcomes {
		if o.err != nil {
			t.Fatalf("slow client: %v", o.err)
		}
		if o.refused {
			refused++
		}
		latest = max(latest, o.closed)
	}
	t.Logf("%d answered 503 too-many-connections (the others past the cap may see a reset), the last closed after %v, %d /readyz probes", refused, latest, probes)
	if refused == 0 {
		t.Fatal("no connection past the cap was answered 503")
	}
	// The body deadline counts from the end of the headers; allow a few
	// seconds for a loaded machine.
	if limit := headerTimeout + bodyTimeout + 10*time.Second; latest > limit {
		t.Fatalf("a slow client stayed connected %v, past %v", latest, limit)
	}
}

// TestGateSlowClientsAreBounded: on the gate's listener, 600 connections
// send half a request head and stall, against a cap of 300 connections.
// Those past the cap are ended at once; those within it are closed at the
// header deadline. Then the lease holder's write goes through, and the
// upstream received exactly that one request.
func TestGateSlowClientsAreBounded(t *testing.T) {
	const (
		clients       = 600
		maxConns      = 300
		headerTimeout = time.Second
	)
	var got atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got.Add(1) }))
	defer up.Close()
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + up.URL, "FENCEGATE_MAX_CONNS=300",
		"FENCEGATE_MAX_CONNS_PER_CLIENT=0", // every client is 127.0.0.1: the total cap is tested
		"FENCEGATE_READ_HEADER_TIMEOUT=" + headerTimeout.String(),
	}, "api", "gate")
	tk := acquireToken(t, p, "job:1", "holder", 60)

	var wg sync.WaitGroup
	var refused, cut atomic.Int64
	started := time.Now()
	for range clients {
		wg.Go(func() {
			c, err := net.Dial("tcp", p.addr["gate"])
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = io.WriteString(c, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Resource: job:1\r\nFencing-To")
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			answer, _ := io.ReadAll(c)
			switch {
			case strings.Contains(string(answer), "too-many-connections"):
				refused.Add(1)
			case strings.Contains(string(answer), "408"):
				cut.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(started)
	t.Logf("%d refused at the cap, %d cut at the header deadline, all ended after %v", refused.Load(), cut.Load(), elapsed)
	if refused.Load() == 0 || cut.Load() == 0 {
		t.Fatalf("refused %d, cut %d: want both", refused.Load(), cut.Load())
	}
	if limit := headerTimeout + 10*time.Second; elapsed > limit {
		t.Fatalf("slow clients held the gate for %v, past %v", elapsed, limit)
	}
	if st, body, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": tk, "Fencing-Resource": "job:1"}, `{}`); st != 200 {
		t.Fatalf("the holder's write after the flood: %d %v", st, body)
	}
	if n := got.Load(); n != 1 {
		t.Fatalf("upstream got %d requests, want 1", n)
	}
}

// TestAPIHeadIsBounded: the lease API reads at most apiMaxHeaderBytes of a
// request's line and headers. A larger head is answered 431 as a problem,
// unauthenticated, instead of being held (net/http's default bound is 1
// MiB a connection: with the connection caps, gigabytes of heads that
// never end); one within the bound is served as before.
func TestAPIHeadIsBounded(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_API_TOKEN=tok-s3cret"}, "api")
	ask := func(extra int) string {
		t.Helper()
		c, err := net.Dial("tcp", p.addr["api"])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		req := "GET /v1/leases/job:1 HTTP/1.1\r\nHost: api\r\nConnection: close\r\nAuthorization: Bearer tok-s3cret\r\nX-Pad: " + strings.Repeat("p", extra) + "\r\n\r\n"
		if _, err := io.WriteString(c, req); err != nil {
			return "write: " + err.Error() // the server may stop reading early
		}
		b, _ := io.ReadAll(io.LimitReader(c, 4096))
		return string(b)
	}
	if got := ask(8 << 10); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Errorf("a head of 8 KiB: %.200q, want 200", got)
	}
	for _, n := range []int{apiMaxHeaderBytes, 64 << 10, 1 << 20} {
		if got := ask(n); !strings.HasPrefix(got, "HTTP/1.1 431") || !strings.Contains(got, "application/problem+json") {
			t.Errorf("a head of %d bytes: %.300q, want 431 as a problem", n, got)
		}
	}
}
