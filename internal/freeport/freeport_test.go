package freeport

import (
	"net"
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
