//go:build linux

package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// Two loopback clients: Linux routes all of 127/8 to lo, so a dialer
// bound to 127.0.0.2 is another client address to the gate.
var (
	hostileIP = net.IPv4(127, 0, 0, 1)
	otherIP   = net.IPv4(127, 0, 0, 2)
)

// perClientWay is how a test reaches the gate: dial opens a connection
// from ip (a TLS one has done its handshake), refused reads what a
// connection past the cap gets.
type perClientWay struct {
	dial    func(t *testing.T, ip net.IP) (net.Conn, error)
	refused func(t *testing.T, c net.Conn, err error)
}

// TestConnsPerClient: with MaxConnsPerClient 4, one client's four idle
// connections fill its share; its fifth is refused (503
// too-many-connections on cleartext, closed before the handshake on
// TLS) and counts against nothing, while another client's fenced write
// goes through to the upstream; once one of the four is closed, the
// first client gets in again. On both engines, cleartext and TLS.
func TestConnsPerClient(t *testing.T) {
	cleartext := func(addr string) perClientWay {
		return perClientWay{
			dial: func(t *testing.T, ip net.IP) (net.Conn, error) {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 10 * time.Second}
				return d.Dial("tcp", addr)
			},
			refused: func(t *testing.T, c net.Conn, err error) {
				if err != nil {
					t.Fatalf("dial past the share: %v", err)
				}
				_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
				answer, _ := io.ReadAll(c) // answered and closed without a request
				s := string(answer)
				if !strings.HasPrefix(s, "HTTP/1.1 503 ") || !strings.Contains(s, "too-many-connections") || !strings.Contains(s, "Retry-After: 1") {
					t.Fatalf("past the share: %q", s)
				}
			},
		}
	}
	for _, loops := range []bool{true, false} {
		t.Run(fmt.Sprintf("loops %v", loops), func(t *testing.T) {
			e := newEnv(t, testRules)
			srv := serveGateWith(t, e.gate, ServerOptions{NoEventLoops: !loops, MaxConnsPerClient: 4})
			if loops {
				waitFor(t, "the event loops serving", func() bool { return srv.srv.engine() != nil })
			}
			testConnsPerClient(t, e, srv.srv, cleartext(srv.Listener.Addr().String()))
		})
	}
	for _, loops := range []bool{true, false} {
		t.Run(fmt.Sprintf("TLS loops %v", loops), func(t *testing.T) {
			e := newTLSLoopEnv(t, ServerOptions{NoTLSLoops: !loops, MaxConnsPerClient: 4}, nil)
			addr := e.srv.Listener.Addr().String()
			way := perClientWay{
				dial: func(t *testing.T, ip net.IP) (net.Conn, error) {
					d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 10 * time.Second}
					c, err := tls.DialWithDialer(d, "tcp", addr, e.client)
					if err != nil {
						return nil, err // not a nil *tls.Conn in a net.Conn
					}
					return c, nil
				},
				refused: func(t *testing.T, c net.Conn, err error) {
					if err == nil {
						c.Close()
						t.Fatal("past the share: the TLS handshake succeeded")
					}
				},
			}
			testConnsPerClient(t, e.env, e.srv.srv, way)
		})
	}
}

func testConnsPerClient(t *testing.T, e *env, s *Server, way perClientWay) {
	waitActive := func(n int64) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%d connections counted", n), func() bool { return s.ActiveConnections() == n })
	}
	// write sends a fenced write from ip on a new connection, which the
	// gate then closes, and checks that it reached the upstream.
	lease := e.acquire("job:1", "holder", time.Minute)
	write := func(ip net.IP, body string) {
		t.Helper()
		c, err := way.dial(t, ip)
		if err != nil {
			t.Fatalf("write from %v: %v", ip, err)
		}
		defer c.Close()
		resp := roundTrip(t, c, bufio.NewReader(c), "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nConnection: close\r\nFencing-Token: "+
			tok(lease.Token)+"\r\nContent-Length: "+fmt.Sprint(len(body))+"\r\n\r\n"+body)
		if resp.StatusCode != 200 {
			t.Fatalf("write from %v: %d", ip, resp.StatusCode)
		}
		for _, r := range e.up.requests() {
			if r.Body == body && r.Token == tok(lease.Token) {
				return
			}
		}
		t.Fatalf("write from %v: not in the upstream's record %v", ip, e.up.requests())
	}

	var idle []net.Conn
	for range 4 {
		c, err := way.dial(t, hostileIP)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		idle = append(idle, c)
	}
	waitActive(4)
	c, err := way.dial(t, hostileIP)
	way.refused(t, c, err)
	if c != nil {
		c.Close()
	}
	if total, perClient := s.limit.Refused(); total != 0 || perClient != 1 {
		t.Errorf("refusals counted: total %d, per-client %d; want 0 and 1", total, perClient)
	}
	waitActive(4) // the refused connection counts against nothing

	write(otherIP, "from another client")
	waitActive(4)

	idle[0].Close()
	waitActive(3)
	write(hostileIP, "after a close")
	waitActive(3)
	if n := s.limit.Clients(); n != 1 {
		t.Errorf("%d clients in the per-client table, want 1 (the idle connections')", n)
	}
	for _, c := range idle[1:] {
		c.Close()
	}
	waitActive(0)
	if n := s.limit.Clients(); n != 0 {
		t.Errorf("%d clients in the per-client table after every close, want none", n)
	}
}
