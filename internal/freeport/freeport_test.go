package freeport

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

// TestPortsAreFreeDistinctAndOutsideTheEphemeralRange: ports from many
// goroutines are all different, below the kernel's ephemeral range, and
// can be bound.
func TestPortsAreFreeDistinctAndOutsideTheEphemeralRange(t *testing.T) {
	top := ephemeralStart()
	const n = 200
	ports := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			p, err := Port()
			if err != nil {
				t.Error(err)
				return
			}
			ports <- p
		})
	}
	wg.Wait()
	close(ports)
	seen := map[int]bool{}
	for p := range ports {
		if seen[p] {
			t.Errorf("port %d given twice", p)
		}
		seen[p] = true
		if top-lowest >= 1000 && (p < lowest || p >= top) {
			t.Errorf("port %d outside [%d, %d)", p, lowest, top)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d ports, want %d", len(seen), n)
	}
	addr, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the address given cannot be bound: %v", err)
	}
	l.Close()
}

// TestPortPairsLieBelowTheEphemeralRange: a pair's upper port (a cluster
// node's bus) is below the ephemeral range too, both can be bound, and no
// port of one pair is given out again, in the other pairs or by Port.
func TestPortPairsLieBelowTheEphemeralRange(t *testing.T) {
	top := ephemeralStart()
	if top-10000-lowest < 1000 {
		t.Skip("the ephemeral range starts too low for pairs 10000 apart")
	}
	seen := map[int]bool{}
	for range 50 {
		p, err := PortPair(10000)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []int{p, p + 10000} {
			if seen[q] {
				t.Errorf("port %d given twice", q)
			}
			seen[q] = true
			if q < lowest || q >= top {
				t.Errorf("port %d outside [%d, %d)", q, lowest, top)
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(q)))
			if err != nil {
				t.Errorf("port %d: %v", q, err)
				continue
			}
			l.Close()
		}
	}
	for range 200 {
		p, err := Port()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Errorf("Port gave %d, a port of a pair", p)
		}
	}
}
