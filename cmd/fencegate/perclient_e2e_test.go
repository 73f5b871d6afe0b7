//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Loopback client addresses: Linux routes all of 127/8 to lo, so a
// dialer bound to 127.0.0.2 is another client to fencegate.
var (
	hostileIP = net.IPv4(127, 0, 0, 1)
	workerIP  = net.IPv4(127, 0, 0, 2)
	scraperIP = net.IPv4(127, 0, 0, 3)
)

// dialFrom opens a TCP connection to addr from ip, closed when t ends.
func dialFrom(t *testing.T, ip net.IP, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %v: %v", addr, ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestConnsPerClientThroughTheBinary: with
// FENCEGATE_MAX_CONNS_PER_CLIENT=4, on the gate and on the lease API, a
// client from 127.0.0.1 holds four keep-alive connections open; its fifth
// is answered 503 too-many-connections (with Retry-After) and closed,
// while a worker from 127.0.0.2 still gets through (its fenced write
// reaches the upstream, its lease call is served); once one of the four
// is closed, 127.0.0.1 gets a connection again. /metrics counts the
// refusals by listener and reason.
func TestConnsPerClientThroughTheBinary(t *testing.T) {
	rec := &recorder{}
	upstream := httptest.NewServer(rec)
	defer upstream.Close()
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}", "FENCEGATE_MAX_CONNS_PER_CLIENT=4",
	}, "api", "gate")

	// acquire takes a lease from ip, on a connection of its own.
	acquire := func(ip net.IP, resource string) (int, string) {
		body := `{"owner":"w","ttl_seconds":60}`
		return exchange(t, dialFrom(t, ip, p.addr["api"]), "POST /v1/leases/"+resource+"/acquire HTTP/1.1\r\nHost: api\r\nConnection: close\r\n"+
			"Content-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	}
	st, body := acquire(workerIP, "job:1")
	if st != 200 {
		t.Fatalf("acquire job:1: %d %s", st, body)
	}
	var lease struct{ Token int64 }
	if err := json.Unmarshal([]byte(body), &lease); err != nil || lease.Token == 0 {
		t.Fatalf("acquire job:1: %s (%v)", body, err)
	}
	// write sends a fenced write from ip and checks it reached the upstream.
	write := func(ip net.IP, c net.Conn, data string) int {
		st, _ := exchange(t, c, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nConnection: close\r\nFencing-Token: "+
			strconv.FormatInt(lease.Token, 10)+"\r\nContent-Length: "+strconv.Itoa(len(data))+"\r\n\r\n"+data)
		want := "PUT /jobs/1 token=" + strconv.FormatInt(lease.Token, 10) + " body=" + data
		if st == 200 && !slices.Contains(rec.list(), want) {
			t.Fatalf("write from %v answered 200 but not in the upstream's record %q", ip, rec.list())
		}
		return st
	}

	for _, l := range []struct {
		name string
		idle string // a request that leaves its connection open
		// served sends what a worker sends from ip on c, and says whether
		// it was served.
		served func(ip net.IP, c net.Conn, n int) bool
	}{
		{"gate", "GET /jobs/1 HTTP/1.1\r\nHost: gate\r\n\r\n", func(ip net.IP, c net.Conn, n int) bool {
			return write(ip, c, fmt.Sprintf(`{"from":"%v","n":%d}`, ip, n)) == 200
		}},
		{"api", "GET /livez HTTP/1.1\r\nHost: api\r\n\r\n", func(ip net.IP, c net.Conn, n int) bool {
			st, _ := exchange(t, c, "GET /v1/leases/job:1 HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
			return st == 200
		}},
	} {
		t.Run(l.name, func(t *testing.T) {
			addr := p.addr[l.name]
			var idle []net.Conn
			for range 4 {
				c := dialFrom(t, hostileIP, addr)
				if st, body := exchange(t, c, l.idle); st != 200 {
					t.Fatalf("within the share: %d %s", st, body)
				}
				idle = append(idle, c)
			}
			fifth := dialFrom(t, hostileIP, addr)
			_ = fifth.SetReadDeadline(time.Now().Add(20 * time.Second))
			answer, _ := io.ReadAll(fifth) // answered and closed without a request
			if s := string(answer); !strings.HasPrefix(s, "HTTP/1.1 503 ") || !strings.Contains(s, "too-many-connections") || !strings.Contains(s, "Retry-After: 1") {
				t.Fatalf("past the share: %q", s)
			}
			if !l.served(workerIP, dialFrom(t, workerIP, addr), 1) {
				t.Fatal("another client, with 127.0.0.1 at its share: not served")
			}
			// The server sees the close when it reads it: until then, a
			// new connection is answered 503 at once.
			idle[0].Close()
			deadline := time.Now().Add(10 * time.Second)
			for {
				c := dialFrom(t, hostileIP, addr)
				_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				n, err := c.Read(make([]byte, 1))
				if ne, ok := err.(net.Error); ok && ne.Timeout() && n == 0 {
					_ = c.SetReadDeadline(time.Time{})
					if !l.served(hostileIP, c, 2) {
						t.Fatal("127.0.0.1 after closing one of its connections: accepted, not served")
					}
					break
				}
				c.Close()
				if time.Now().After(deadline) {
					t.Fatal("127.0.0.1 after closing one of its connections: still refused")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}

	c := dialFrom(t, scraperIP, p.addr["api"])
	st, text := exchange(t, c, "GET /metrics HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
	if st != 200 {
		t.Fatalf("/metrics: %d", st)
	}
	for _, listener := range []string{"gate", "api"} {
		if n := sample(text, "fencegate_connections_refused_total", `listener="`+listener+`"`, `reason="per-client"`); n < 1 {
			t.Errorf("fencegate_connections_refused_total{listener=%q,reason=\"per-client\"} = %v, want at least 1", listener, n)
		}
		if n := sample(text, "fencegate_connections_refused_total", `listener="`+listener+`"`, `reason="total"`); n != 0 {
			t.Errorf("fencegate_connections_refused_total{listener=%q,reason=\"total\"} = %v, want 0", listener, n)
		}
	}
}
