package syncbuf_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/fencegate/fencegate/internal/syncbuf"
)

// TestConcurrentWritesAndReads: writers and readers at once (run with
// -race); every write is there at the end, whole.
func TestConcurrentWritesAndReads(t *testing.T) {
	var b syncbuf.Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("line\n"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := strings.Count(b.String(), "line\n"); n != 800 || len(b.String()) != 800*len("line\n") {
		t.Fatalf("%d whole lines in %d bytes, want 800", n, len(b.String()))
	}
}
