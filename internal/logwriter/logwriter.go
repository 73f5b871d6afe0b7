// Package logwriter lets a busy event loop write its log lines in one
// write per pass instead of one per line.
//
// A Writer passes each write straight to its output, except while it is
// held (Hold): it then keeps the bytes, and writes what it kept in one
// write when a holder lets go (Release). The gate's event loops hold it
// for each pass over their ready sockets, so that the audit lines of a
// pass (one per write forwarded) go out together at its end, on the
// loop's own thread. Written one by one, on a 2-CPU virtual machine,
// those lines cost the gate about a quarter of its throughput
// (scripts/bench.sh with FENCEGATE_LOG_LEVEL=info); handing them to
// another goroutine to write cost more still, in thread wake-ups.
//
// Lines are kept in the order they were written, and a line written by
// anyone while a loop holds the Writer waits for the end of that pass.
// Nothing is dropped: past Limit bytes kept, the next write writes them
// out. Lines still kept when the process dies (a crash, os.Exit without
// Flush) are lost: at most one pass's.
package logwriter

import (
	"io"
	"sync"
)

// Limit is how many bytes a held Writer keeps before it writes them out
// anyway.
const Limit = 64 << 10

// Writer is an io.Writer in front of another that gathers writes while
// held (see the package doc). Its methods are safe for concurrent use.
type Writer struct {
	out   io.Writer
	mu    sync.Mutex
	holds int
	kept  []byte
}

// New returns a Writer in front of out, not held.
func New(out io.Writer) *Writer { return &Writer{out: out} }

// Write writes p to the output, or keeps a copy of it while the Writer is
// held. A failed write of kept bytes is not reported: a log line has
// nowhere to report it.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.holds == 0 {
		w.flushLocked()
		return w.out.Write(p)
	}
	if len(w.kept)+len(p) > Limit {
		w.flushLocked()
	}
	w.kept = append(w.kept, p...)
	return len(p), nil
}

// Hold makes the Writer keep what is written until the matching Release.
func (w *Writer) Hold() {
	w.mu.Lock()
	w.holds++
	w.mu.Unlock()
}

// Release ends a Hold and writes out what was kept (by this holder or
// any other: a line waits for at most the end of one holder's pass).
func (w *Writer) Release() {
	w.mu.Lock()
	w.holds--
	w.flushLocked()
	w.mu.Unlock()
}

// Flush writes out what was kept.
func (w *Writer) Flush() {
	w.mu.Lock()
	w.flushLocked()
	w.mu.Unlock()
}

func (w *Writer) flushLocked() {
	if len(w.kept) == 0 {
		return
	}
	_, _ = w.out.Write(w.kept)
	if cap(w.kept) > 4*Limit {
		w.kept = nil
	} else {
		w.kept = w.kept[:0]
	}
}
