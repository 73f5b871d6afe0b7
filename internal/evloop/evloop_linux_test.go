package evloop

import (
	"errors"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newPoller returns a poller closed when the test ends.
func newPoller(t *testing.T) *Poller {
	t.Helper()
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func socketpair(t *testing.T) [2]int {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return [2]int(fds)
}

// TestSockBrokeOnAFailedRegistration: a socket whose registration change
// fails (it is not in the poller's set: EPOLL_CTL_MOD gives ENOENT)
// reports the error on its next write and reads nothing more; a write
// that blocks and cannot ask to be woken fails too.
func TestSockBrokeOnAFailedRegistration(t *testing.T) {
	p := newPoller(t)
	fds := socketpair(t)
	s := &Sock{FD: fds[0]}
	s.Note(p, unix.EPOLLOUT|unix.EPOLLIN)
	if !errors.Is(s.Err, unix.ENOENT) {
		t.Fatalf("Err = %v, want ENOENT from epoll_ctl", s.Err)
	}
	if _, err := s.Write(p, []byte("x")); err == nil {
		t.Fatal("a write after the failure reported no error")
	}
	if s.Fill(make([]byte, 16)) {
		t.Fatal("a read after the failure took bytes")
	}
	s2 := &Sock{FD: fds[1], Writable: true}
	if _, err := s2.Write(p, make([]byte, 8<<20)); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a blocked write: %v, want ENOENT from epoll_ctl", err)
	}
}

// TestSockReadsAndWrites: a watched socket pair moves bytes both ways, a
// full socket is watched for writing and reported writable again once
// the peer reads, and the end of the stream is read as EOF.
func TestSockReadsAndWrites(t *testing.T) {
	p := newPoller(t)
	fds := socketpair(t)
	a, b := &Sock{FD: fds[0], Writable: true}, &Sock{FD: fds[1], Writable: true}
	for _, s := range []*Sock{a, b} {
		if err := p.Watch(s.FD, unix.EPOLL_CTL_ADD, false); err != nil {
			t.Fatal(err)
		}
	}
	big := make([]byte, 8<<20)
	n, err := a.Write(p, big)
	if err != nil || n == len(big) || a.Writable {
		t.Fatalf("wrote %d of %d, %v, writable %v: want a blocked write", n, len(big), err, a.Writable)
	}
	events := make([]unix.EpollEvent, 8)
	buf := make([]byte, 64<<10)
	got := 0
	for !a.Writable {
		k, err := p.Wait(events, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events[:k] {
			switch int(ev.Fd) {
			case a.FD:
				a.Note(p, ev.Events)
			case b.FD:
				b.Note(p, ev.Events)
			}
		}
		for b.Fill(buf) {
			got += len(b.In)
			b.In = b.In[:0]
		}
	}
	if got == 0 {
		t.Fatal("the peer read nothing")
	}
	unix.Close(fds[0])
	for !b.EOF {
		k, err := p.Wait(events, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events[:k] {
			if int(ev.Fd) == b.FD {
				b.Note(p, ev.Events)
			}
		}
		for b.Fill(buf) {
			b.In = b.In[:0]
		}
	}
}

// TestSockReadIntoAndConsumed: ReadInto reads into the caller's buffer,
// follows the readiness as Fill does (a short read drains the socket; the
// end of the stream is EOF), and Consumed lets go of a large read buffer
// once its bytes are consumed, and only then.
func TestSockReadIntoAndConsumed(t *testing.T) {
	fds := socketpair(t)
	s := &Sock{FD: fds[1], Readable: true}
	if _, err := unix.Write(fds[0], []byte("hello")); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 16)
	n, ok := s.ReadInto(p)
	if !ok || string(p[:n]) != "hello" || s.Readable || len(s.In) != 0 {
		t.Fatalf("ReadInto: %d %q %v, readable %v, In %q", n, p[:n], ok, s.Readable, s.In)
	}
	if n, ok := s.ReadInto(p); ok || n != 0 {
		t.Fatalf("ReadInto on a drained socket: %d %v", n, ok)
	}
	s.Readable = true
	if n, ok := s.ReadInto(p); ok || n != 0 || s.Readable || s.EOF {
		t.Fatalf("ReadInto with nothing sent: %d %v, readable %v, EOF %v; want EAGAIN", n, ok, s.Readable, s.EOF)
	}

	big := make([]byte, KeepBuffer+1)
	if _, err := unix.Write(fds[0], big); err != nil {
		t.Fatal(err)
	}
	s.Readable = true
	if !s.Fill(make([]byte, len(big))) || len(s.In) != len(big) {
		t.Fatalf("Fill: %d bytes", len(s.In))
	}
	s.Consumed()
	if cap(s.keep) == 0 {
		t.Fatal("Consumed let go of a buffer whose bytes are still in In")
	}
	s.In = s.In[len(s.In):]
	s.Consumed()
	if cap(s.keep) != 0 || s.In != nil {
		t.Fatalf("Consumed kept a %d-byte buffer once its bytes were consumed", cap(s.keep))
	}

	if err := unix.Shutdown(fds[0], unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	s.Readable = true
	if n, ok := s.ReadInto(p); ok || n != 0 || !s.EOF {
		t.Fatalf("ReadInto at the end of the stream: %d %v, EOF %v", n, ok, s.EOF)
	}
}

// TestPollerPost: work posted from other goroutines runs on the loop, a
// sleeping loop is woken for it, and after Shut a post is refused while
// what was posted before is handed back.
func TestPollerPost(t *testing.T) {
	p := newPoller(t)
	var wg sync.WaitGroup
	const posts = 100
	ran := 0
	for range posts {
		wg.Go(func() {
			if !p.Post(func() { ran++ }) {
				t.Error("a post before Shut was refused")
			}
		})
	}
	events := make([]unix.EpollEvent, 4)
	for ran < posts {
		// A tick of an hour: only the eventfd can wake it in time.
		if _, err := p.Wait(events, time.Hour); err != nil {
			t.Fatal(err)
		}
		for _, f := range p.Take() {
			f()
		}
	}
	wg.Wait()
	p.Post(func() {})
	if work := p.Shut(); len(work) != 1 {
		t.Fatalf("Shut handed back %d posts, want 1", len(work))
	}
	if p.Post(func() {}) {
		t.Fatal("a post after Shut was accepted")
	}
}

// TestPeek: the raw look Wait takes first reports the ready sockets, and
// nothing (at once, without blocking) when none is ready.
func TestPeek(t *testing.T) {
	p := newPoller(t)
	fds := socketpair(t)
	if err := p.Watch(fds[0], unix.EPOLL_CTL_ADD, false); err != nil {
		t.Fatal(err)
	}
	events := make([]unix.EpollEvent, 4)
	if n, err := peek(p.FD(), events); n != 0 || err != nil {
		t.Fatalf("peek with nothing ready = %d, %v; want 0, nil", n, err)
	}
	if _, err := unix.Write(fds[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	n, err := peek(p.FD(), events)
	if n != 1 || err != nil || int(events[0].Fd) != fds[0] || events[0].Events&unix.EPOLLIN == 0 {
		t.Fatalf("peek with one socket readable = %d, %v, %+v; want that socket readable", n, err, events[0])
	}
	// Edge-triggered: the event was reported; Wait with an hour's tick
	// must not sleep once work is posted.
	p.Post(func() {})
	if n, err := p.Wait(events, time.Hour); n != 0 || err != nil {
		t.Fatalf("Wait after a post = %d, %v; want 0, nil at once", n, err)
	}
	if n, err := peek(p.FD(), nil); n != 0 || err != nil {
		t.Fatalf("peek into no room = %d, %v; want 0, nil", n, err)
	}
}
