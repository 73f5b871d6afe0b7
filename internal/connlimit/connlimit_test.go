package connlimit_test

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/connlimit"
)

// A connection beyond the cap gets the cleartext refusal, or, with
// CloseOnly (a TLS listener), is closed without a byte.
func TestBeyondTheCap(t *testing.T) {
	for _, closeOnly := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		counter := connlimit.NewCounter(1, 0, 0)
		counter.Acquire(netip.Addr{}) // the one connection allowed is taken
		l := &connlimit.Listener{Listener: ln, Counter: counter, CloseOnly: closeOnly}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		got, _ := io.ReadAll(c)
		c.Close()
		ln.Close()
		want := connlimit.Refusal
		if closeOnly {
			want = nil
		}
		if !bytes.Equal(got, want) {
			t.Errorf("CloseOnly %v: read %q, want %q", closeOnly, got, want)
		}
	}
}

// Many goroutines from a few clients acquire and release at once: no
// client ever holds more than its share, every refusal is counted with
// its reason, and once all are released nothing is counted and no client
// is left in the table.
func TestPerClientConcurrent(t *testing.T) {
	const perClient, clients, workers, rounds = 3, 4, 32, 2000
	c := connlimit.NewCounter(0, 0, perClient)
	keys := make([]netip.Addr, clients)
	held := make([]atomic.Int64, clients)
	for i := range keys {
		keys[i] = netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
	}
	var acquired, refused atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				i := (w + r) % clients
				if _, ok := c.Acquire(keys[i]); !ok {
					refused.Add(1)
					continue
				}
				acquired.Add(1)
				if n := held[i].Add(1); n > perClient {
					t.Errorf("client %v holds %d connections, share %d", keys[i], n, perClient)
				}
				held[i].Add(-1)
				c.Release(keys[i])
			}
		}()
	}
	wg.Wait()
	if acquired.Load()+refused.Load() != workers*rounds || acquired.Load() == 0 {
		t.Fatalf("%d acquired + %d refused, want %d in all", acquired.Load(), refused.Load(), workers*rounds)
	}
	total, perClientRefused := c.Refused()
	if total != 0 || perClientRefused != refused.Load() {
		t.Errorf("refusals counted: total %d, per-client %d; want 0 and %d", total, perClientRefused, refused.Load())
	}
	if c.Active() != 0 || c.Clients() != 0 {
		t.Errorf("after every release: %d connections counted, %d clients in the table; want none", c.Active(), c.Clients())
	}
}

// The per-client cap: one client past its share is refused while another
// gets in; a release makes room again; a connection refused for its
// client counts against nothing; IPv6 addresses of one /64 share a count
// and an IPv4-mapped address counts as the IPv4 one; the zero Addr (no IP
// address: a Unix socket) is not capped; the total cap is checked first.
func TestPerClientShare(t *testing.T) {
	c := connlimit.NewCounter(5, 0, 2)
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	for range 2 {
		if _, ok := c.Acquire(a); !ok {
			t.Fatal("within a's share: refused")
		}
	}
	if _, ok := c.Acquire(a); ok {
		t.Fatal("past a's share: accepted")
	}
	if c.Active() != 2 {
		t.Fatalf("a refused connection is counted: %d active", c.Active())
	}
	if _, ok := c.Acquire(b); !ok {
		t.Fatal("b, with a at its share: refused")
	}
	c.Release(a)
	if _, ok := c.Acquire(a); !ok {
		t.Fatal("a after a release: refused")
	}
	if _, ok := c.Acquire(netip.Addr{}); !ok {
		t.Fatal("no address, within the total: refused")
	}
	if _, ok := c.Acquire(netip.Addr{}); !ok {
		t.Fatal("no address, at the total: refused")
	}
	if _, ok := c.Acquire(b); ok {
		t.Fatal("past the total: accepted")
	}
	if total, perClient := c.Refused(); total != 1 || perClient != 1 {
		t.Fatalf("refusals: total %d, per-client %d; want 1 and 1", total, perClient)
	}

	for _, k := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}, "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}, "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 1}, "2001:db8:1:2::"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::9"), Port: 1, Zone: "eth0"}, "2001:db8:1:2::"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:3::1"), Port: 1}, "2001:db8:1:3::"},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, "invalid IP"},
	} {
		if got := connlimit.Client(k.addr).String(); got != k.want {
			t.Errorf("Client(%v) = %s, want %s", k.addr, got, k.want)
		}
	}
}
