package logwriter

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// recorder records the writes it gets, each one whole.
type recorder struct {
	mu     sync.Mutex
	writes []string
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.writes = append(r.writes, string(p))
	r.mu.Unlock()
	return len(p), nil
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.writes...)
}

// TestNotHeldWritesThrough: a Writer nobody holds writes each write at
// once, as it comes.
func TestNotHeldWritesThrough(t *testing.T) {
	var out recorder
	w := New(&out)
	fmt.Fprint(w, "a\n")
	fmt.Fprint(w, "b\n")
	if got := out.got(); len(got) != 2 || got[0] != "a\n" || got[1] != "b\n" {
		t.Fatalf("the output got %q", got)
	}
}

// TestHeldLinesGoInOneWriteOnRelease: what is written while held reaches
// the output in one write, in order, when the holder lets go; the buffer
// given to Write is not kept.
func TestHeldLinesGoInOneWriteOnRelease(t *testing.T) {
	var out recorder
	w := New(&out)
	w.Hold()
	var want strings.Builder
	buf := make([]byte, 0, 16)
	for i := range 100 {
		buf = fmt.Appendf(buf[:0], "line %d\n", i)
		want.Write(buf)
		if n, err := w.Write(buf); n != len(buf) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if got := out.got(); len(got) != 0 {
		t.Fatalf("the output got %q while the Writer was held", got)
	}
	w.Release()
	if got := out.got(); len(got) != 1 || got[0] != want.String() {
		t.Fatalf("the output got %d writes %q, want the 100 lines in one", len(got), got)
	}
	fmt.Fprint(w, "after\n")
	if got := out.got(); len(got) != 2 || got[1] != "after\n" {
		t.Fatalf("a write after Release did not go through at once: %q", got)
	}
}

// TestEveryReleaseWritesOut: with two holders (two loops), each Release
// writes out what was kept, so one busy holder does not hold back the
// other's lines; Flush writes them out too.
func TestEveryReleaseWritesOut(t *testing.T) {
	var out recorder
	w := New(&out)
	w.Hold()
	w.Hold()
	fmt.Fprint(w, "one\n")
	w.Release()
	fmt.Fprint(w, "two\n")
	if got := out.got(); len(got) != 1 || got[0] != "one\n" {
		t.Fatalf("the first Release wrote %q, want \"one\\n\"", got)
	}
	w.Flush()
	if got := out.got(); len(got) != 2 || got[1] != "two\n" {
		t.Fatalf("Flush wrote %q", got)
	}
	w.Release()
	if got := out.got(); len(got) != 2 {
		t.Fatalf("a Release with nothing kept wrote %q", got[2:])
	}
}

// TestLimitWritesOutWhileHeld: a held Writer keeps at most Limit bytes;
// the write that would pass it writes out what was kept first.
func TestLimitWritesOutWhileHeld(t *testing.T) {
	var out recorder
	w := New(&out)
	w.Hold()
	defer w.Release()
	line := strings.Repeat("x", 1023) + "\n"
	for range Limit / len(line) {
		fmt.Fprint(w, line)
	}
	if got := out.got(); len(got) != 0 {
		t.Fatalf("%d writes before the limit", len(got))
	}
	fmt.Fprint(w, "over\n")
	if got := out.got(); len(got) != 1 || len(got[0]) != Limit {
		t.Fatalf("passing the limit wrote %d writes (first %d bytes), want one of %d", len(got), len(strings.Join(got, "")), Limit)
	}
}

// TestManyWritersAndHoldersLoseNothing: lines from many goroutines, some
// holding and releasing the Writer as loops do, all arrive, each whole,
// each goroutine's in the order it wrote them.
func TestManyWritersAndHoldersLoseNothing(t *testing.T) {
	const writers, lines = 16, 2000
	var mu sync.Mutex
	var out bytes.Buffer
	w := New(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return out.Write(p)
	}))
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			holder := g%2 == 0
			buf := make([]byte, 0, 32)
			for n := range lines {
				if holder && n%20 == 0 {
					w.Hold()
				}
				buf = fmt.Appendf(buf[:0], "g%d n%d\n", g, n)
				_, _ = w.Write(buf)
				if holder && (n%20 == 19 || n == lines-1) {
					w.Release()
				}
			}
		})
	}
	wg.Wait()
	w.Flush()
	next := make([]int, writers)
	count := 0
	for line := range strings.Lines(out.String()) {
		var g, n int
		if _, err := fmt.Sscanf(line, "g%d n%d\n", &g, &n); err != nil || g < 0 || g >= writers {
			t.Fatalf("torn or foreign line %q", line)
		}
		if n != next[g] {
			t.Fatalf("writer %d: line %d after line %d", g, n, next[g]-1)
		}
		next[g]++
		count++
	}
	if count != writers*lines {
		t.Fatalf("%d lines arrived, want %d", count, writers*lines)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
