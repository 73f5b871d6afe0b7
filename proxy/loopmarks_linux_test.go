//go:build linux

package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/syncbuf"
)

// markedStore is batchedStore with mark readers (fencing.MarkReaders), as
// the Valkey store on a single node has. Each reader is one end of a socket
// pair; a goroutine at the other end plays the server and answers each
// batch as mode says:
//
//	answer   "ok": the reader then settles each request whose token is at
//	         the memory store's mark, read at that moment
//	pending  as answer, but the reader's Send writes nothing and reports
//	         bytes pending: they go out on Flush, once the loop finds the
//	         socket writable
//	close    closes its end
//	stall    never answers (the reader is overdue after overdueAfter)
//	garbage  answers what no reader understands
//	unread   gets nothing: the reader's Send finds no request it can
//	         read (as the Valkey store's with invalid ones) and its
//	         Receive settles none, at once
//	panic    OpenMarkReader panics (a defect in the store's code)
type markedStore struct {
	batchedStore
	mode         atomic.Pointer[string]
	overdueAfter time.Duration
	opened       atomic.Int64
	closed       atomic.Int64 // readers closed (failed, or at the end)
	settled      atomic.Int64
	sentBatches  atomic.Int64
	panics       atomic.Int64 // OpenMarkReader calls that panicked
}

var _ fencing.MarkReaders = (*markedStore)(nil)

func init() {
	newMarkedVariant = func(st fencing.Store) fencing.Store { return markedOver(st, "answer") }
}

// markedOver returns st with mark readers in the given mode.
func markedOver(st fencing.Store, mode string) *markedStore {
	m := &markedStore{batchedStore: batchedStore{Store: st}, overdueAfter: 200 * time.Millisecond}
	m.mode.Store(&mode)
	return m
}

func (m *markedStore) OpenMarkReader(ctx context.Context) (fencing.MarkReader, error) {
	if *m.mode.Load() == "panic" {
		m.panics.Add(1)
		panic("provoked by the test")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fds[1]), "fake-store")
	srv, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[0])
		return nil, err
	}
	m.opened.Add(1)
	go m.serve(srv)
	return &fakeMarkReader{st: m, fd: fds[0]}, nil
}

// serve answers each batch line ("n\n") as the store's mode says.
func (m *markedStore) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		if _, err := r.ReadString('\n'); err != nil {
			return
		}
		m.sentBatches.Add(1)
		switch *m.mode.Load() {
		case "answer", "pending":
			_, _ = c.Write([]byte("ok\n"))
		case "close":
			return
		case "garbage":
			_, _ = c.Write([]byte("what?\n"))
		}
	}
}

// fakeMarkReader is a markedStore's fencing.MarkReader.
type fakeMarkReader struct {
	st     *markedStore
	fd     int
	reqs   []fencing.AdmitRequest
	sentAt time.Time
	out    []byte // the batch line, until written
	in     []byte
	unread bool // the batch needs no read (mode unread)
}

func (r *fakeMarkReader) Fd() int { return r.fd }

func (r *fakeMarkReader) Send(now time.Time, reqs []fencing.AdmitRequest) (bool, error) {
	r.reqs, r.sentAt, r.in = reqs, now, r.in[:0]
	r.out = []byte(strconv.Itoa(len(reqs)) + "\n")
	switch *r.st.mode.Load() {
	case "pending":
		return true, nil
	case "unread":
		r.out, r.unread = nil, true
		return false, nil
	}
	return r.Flush()
}

func (r *fakeMarkReader) Flush() (bool, error) {
	_, err := unix.Write(r.fd, r.out)
	r.out = nil
	return false, err
}

func (r *fakeMarkReader) Awaiting() bool { return r.reqs != nil && !r.unread }

func (r *fakeMarkReader) Receive(out []fencing.Admission, settled []bool) (bool, error) {
	if r.unread {
		clear(settled[:len(r.reqs)])
		r.reqs, r.unread = nil, false
		return true, nil
	}
	var b [64]byte
	n, err := unix.Read(r.fd, b[:])
	switch {
	case err == unix.EAGAIN:
		return false, nil
	case err != nil:
		return false, err
	case n == 0:
		return false, errors.New("fake store closed")
	}
	r.in = append(r.in, b[:n]...)
	if string(r.in) != "ok\n" {
		return false, fmt.Errorf("fake store answered %q", r.in)
	}
	for i, req := range r.reqs {
		s, err := r.st.Status(context.Background(), req.Resource)
		settled[i] = err == nil && !req.RequireLive && req.Token == s.HighWater && req.Token <= s.Issued
		if settled[i] {
			out[i] = fencing.Admission{Resource: req.Resource, Token: req.Token, HighWater: s.HighWater, Issued: s.Issued}
			r.st.settled.Add(1)
		}
	}
	r.reqs = nil
	return true, nil
}

func (r *fakeMarkReader) Overdue(now time.Time) bool {
	return r.reqs != nil && now.Sub(r.sentAt) > r.st.overdueAfter
}

func (r *fakeMarkReader) Close() error {
	r.st.closed.Add(1)
	return unix.Close(r.fd)
}

// TestLoopMarkReaders: with a store that has mark readers, a loop reads the
// marks of its batches itself and forwards the writes read at the mark;
// every other write (a raise, stale, not issued, one needing a live lease)
// and every write of a batch whose reader fails (closed, garbage, late)
// is admitted by the worker, as is every write of a batch the reader
// settles at once without reading. Whatever the reader does, each write
// gets the answer it would get alone, and the upstream receives exactly
// the admitted ones with their tokens.
func TestLoopMarkReaders(t *testing.T) {
	for _, mode := range []string{"answer", "pending", "close", "stall", "garbage", "unread"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			st := markedOver(memstore.New(memstore.Options{Clock: clock}), mode)
			e := newEnvStore(t, testRules, st, clock)
			if e.gate.marks == nil {
				t.Fatal("the gate does not use the store's mark readers")
			}
			type write struct {
				res    string
				tok    fencing.Token
				status int
			}
			var writes []write
			for r := range 4 {
				res := fmt.Sprintf("job:%d", r)
				old := e.acquire(res, "a", time.Hour)
				if _, err := st.Release(context.Background(), fencing.ReleaseRequest{Resource: res, Owner: "a", Token: old.Token}); err != nil {
					t.Fatal(err)
				}
				cur := e.acquire(res, "b", time.Hour)
				if r%2 == 0 { // at the mark; on the others the first write raises it
					if _, err := st.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: cur.Token}); err != nil {
						t.Fatal(err)
					}
				}
				for i := range 10 {
					switch {
					case i%5 == 0 && r%2 == 0:
						writes = append(writes, write{res, old.Token, http.StatusConflict}) // stale
					case i%5 == 1:
						writes = append(writes, write{res, cur.Token + 1, http.StatusConflict}) // not issued
					default:
						writes = append(writes, write{res, cur.Token, http.StatusOK})
					}
				}
			}
			// Three rounds: the first opens the reader; the others use it
			// (or, after a failure, the worker alone).
			for round := range 3 {
				got := make([]response, len(writes))
				var wg sync.WaitGroup
				for i, w := range writes {
					wg.Go(func() {
						got[i] = e.do("PUT", "/jobs/"+w.res[len("job:"):], fmt.Sprintf("r%dw%d", round, i), HeaderToken, tok(w.tok))
					})
				}
				wg.Wait()
				for i, w := range writes {
					if got[i].Status != w.status {
						t.Fatalf("round %d, write %d (%s, token %d): %d %s, want %d", round, i, w.res, w.tok, got[i].Status, got[i].Body, w.status)
					}
				}
				if round == 0 {
					waitFor(t, "the loops to open their readers", func() bool { return st.opened.Load() > 0 })
				}
			}
			want := 0
			for _, w := range writes {
				if w.status == http.StatusOK {
					want += 3
				}
			}
			recs := e.up.requests()
			if len(recs) != want {
				t.Fatalf("the upstream received %d writes, want the %d admitted", len(recs), want)
			}
			for _, rec := range recs {
				var round, n int
				if _, err := fmt.Sscanf(rec.Body, "r%dw%d", &round, &n); err != nil || writes[n].status != http.StatusOK || rec.Token != tok(writes[n].tok) {
					t.Fatalf("the upstream received %+v, which the gate did not admit", rec)
				}
			}
			settled, batches := st.settled.Load(), st.sentBatches.Load()
			switch mode {
			case "answer", "pending":
				if settled == 0 {
					t.Fatal("no write was settled by a mark reader")
				}
			case "unread":
				// Each batch is settled at once: no reader waits for an
				// answer that will not come until it is overdue and closed.
				if settled != 0 || batches != 0 || st.closed.Load() != 0 {
					t.Fatalf("%d writes settled, %d batches sent, %d readers closed, by readers with nothing to read; want none", settled, batches, st.closed.Load())
				}
			default:
				if settled != 0 || batches == 0 {
					t.Fatalf("%d writes settled, %d batches sent to a failing reader; want 0 and at least 1", settled, batches)
				}
			}
		})
	}
}

// TestLoopMarkReadersSwitchedOff: with ServerOptions.NoMarkReaders
// (FENCEGATE_MARK_READERS=false) the loops never open the store's mark
// readers: every write is admitted through the store's client, with the
// answer it gets with them.
func TestLoopMarkReadersSwitchedOff(t *testing.T) {
	st := markedOver(memstore.New(memstore.Options{}), "answer")
	rs, err := ParseRules(testRules)
	if err != nil {
		t.Fatal(err)
	}
	up := newRawUpstream(t)
	u, _ := url.Parse("http://" + up.ln.Addr().String())
	g, err := New(Options{Upstream: u, Store: st, Rules: rs})
	if err != nil {
		t.Fatal(err)
	}
	if g.marks == nil {
		t.Fatal("the gate does not see the store's mark readers")
	}
	gs := serveGateWith(t, g, ServerOptions{NoMarkReaders: true})
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:1", Owner: "a", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c := gs.Client()
	const writes = 20
	var wg sync.WaitGroup
	for range writes {
		wg.Go(func() {
			if !writeJob1(t, gs, c, l.Token, "x") {
				t.Error("a write was refused")
			}
		})
	}
	wg.Wait()
	if n := len(up.take()); n != writes {
		t.Fatalf("the upstream got %d writes, want %d", n, writes)
	}
	if opened, sent := st.opened.Load(), st.sentBatches.Load(); opened != 0 || sent != 0 {
		t.Fatalf("%d mark readers opened, %d batches sent to them; want none", opened, sent)
	}
}

// TestLoopMarkReaderOpenPanic: a panic in the store's OpenMarkReader, on
// the goroutine a loop opens its reader with, is contained as a failed
// open: counted and logged with its cause, the loop's writes are admitted
// through the store (answered, forwarded once each), and the loop opens a
// reader again after its pause, which then settles writes. Were the panic
// not contained, the test binary would exit.
func TestLoopMarkReaderOpenPanic(t *testing.T) {
	st := markedOver(memstore.New(memstore.Options{}), "panic")
	var logs syncbuf.Buffer
	e, write, writes := loopWriter(t, st, slog.NewJSONHandler(&logs, nil))
	write() // has the loop open its reader
	waitFor(t, "the opening to panic", func() bool { return e.gate.tel.panics.Load() > 0 })
	write()
	if n := e.up.count(); n != *writes {
		t.Fatalf("the upstream got %d writes, want the %d answered", n, *writes)
	}
	waitFor(t, "each panic provoked to be counted", func() bool { return e.gate.tel.panics.Load() == st.panics.Load() })
	if !strings.Contains(logs.String(), "contained a panic opening the store's mark reader") || !strings.Contains(logs.String(), "provoked by the test") {
		t.Fatalf("the panic is not logged with its cause; log:\n%s", logs.String())
	}
	mode := "answer"
	st.mode.Store(&mode)
	for end := time.Now().Add(10 * time.Second); st.settled.Load() == 0; { // after markRetryMin
		if time.Now().After(end) {
			t.Fatal("no reader settled a write after the failed open")
		}
		write()
		time.Sleep(10 * time.Millisecond)
	}
	if n := e.up.count(); n != *writes {
		t.Fatalf("the upstream got %d writes, want the %d answered", n, *writes)
	}
}

// loopWriter serves a gate over st on the event loops, logging to h, with
// job:1 held; write sends the next fenced write (w0, w1, ...) and fails
// the test unless it is answered 200; writes counts those answered.
func loopWriter(t *testing.T, st fencing.Store, h slog.Handler) (e *env, write func(), writes *int) {
	t.Helper()
	e = newEnvStore(t, testRules, st, nil, func(o *Options) { o.Logger = slog.New(h) })
	waitFor(t, "the server to start", func() bool { return e.gateSrv.srv.engine() != nil })
	if e.gateSrv.srv.loops.Load() == nil {
		t.Skip("no event loops on this listener")
	}
	l := e.acquire("job:1", "w", time.Hour)
	writes = new(int)
	write = func() {
		t.Helper()
		if r := e.do("PUT", "/jobs/1", fmt.Sprint("w", *writes), HeaderToken, tok(l.Token)); r.Status != http.StatusOK {
			t.Fatalf("write %d: %d %s", *writes, r.Status, r.Body)
		}
		*writes++
	}
	return e, write, writes
}
