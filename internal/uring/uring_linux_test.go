//go:build linux

package uring

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// newRing makes a ring on the test's goroutine, locked to its thread as a
// ring's user must be, or skips where the kernel refuses io_uring.
func newRing(t *testing.T, entries uint32) *Ring {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	r, err := New(entries)
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// tcpPair is a connected pair of non-blocking loopback TCP sockets.
func tcpPair(t testing.TB) (a, b int) {
	t.Helper()
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 1); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(ln)
	if err != nil {
		t.Fatal(err)
	}
	a, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(a, sa); err != nil {
		t.Fatal(err)
	}
	b, _, err = unix.Accept4(ln, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range []int{a, b} {
		if err := unix.SetNonblock(fd, true); err != nil {
			t.Fatal(err)
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { unix.Close(a); unix.Close(b) })
	return a, b
}

// results collects what Submit gives, by tag.
type results map[uint64]int32

func (rs results) add(tag uint64, res int32) {
	if _, dup := rs[tag]; dup {
		panic(fmt.Sprintf("tag %d answered twice", tag))
	}
	rs[tag] = res
}

// Both ways of entering the kernel (see Submit): a raw call up to
// RawEnterMax operations, the scheduler's call beyond.
func TestSendsAndReceivesOnManySocketsInOneSubmit(t *testing.T) {
	for _, n := range []int{40, RawEnterMax + 36} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { sendAndReceiveOnSockets(t, n) })
	}
}

func sendAndReceiveOnSockets(t *testing.T, n int) {
	r := newRing(t, 128)
	ws, rs := make([]int, n), make([]int, n)
	for i := range n {
		ws[i], rs[i] = tcpPair(t)
	}
	for round := range 3 {
		msgs := make([][]byte, n)
		got := results{}
		for i := range n {
			msgs[i] = fmt.Appendf(nil, "round %d, socket %d: %s", round, i, bytes.Repeat([]byte{'x'}, i*50))
			if !r.Send(ws[i], msgs[i], uint64(i)) {
				t.Fatalf("send %d not queued", i)
			}
		}
		if err := r.Submit(got.add); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if got[uint64(i)] != int32(len(msgs[i])) {
				t.Fatalf("round %d: send %d gave %d, want %d", round, i, got[uint64(i)], len(msgs[i]))
			}
		}
		bufs := make([][]byte, n)
		got = results{}
		for i := range n {
			bufs[i] = make([]byte, 8192)
			r.Recv(rs[i], bufs[i], uint64(100+i))
		}
		if err := r.Submit(got.add); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			res := got[uint64(100+i)]
			if res < 0 || !bytes.Equal(bufs[i][:res], msgs[i]) {
				t.Fatalf("round %d: recv %d gave %d: %q, want %q", round, i, res, bufs[i][:max(res, 0)], msgs[i])
			}
		}
	}
}

func TestOperationsNeverWait(t *testing.T) {
	r := newRing(t, 8)
	a, b := tcpPair(t)
	got := results{}
	buf := make([]byte, 1<<20)
	r.Recv(b, buf[:100], 1) // nothing sent yet
	if err := r.Submit(got.add); err != nil {
		t.Fatal(err)
	}
	if got[1] != -int32(unix.EAGAIN) {
		t.Fatalf("recv on an empty socket gave %d, want -EAGAIN", got[1])
	}
	// Send until the socket has no room: the ring answers EAGAIN instead
	// of waiting for the peer to read.
	sent := 0
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatalf("the socket took %d bytes without filling up", sent)
		}
		got = results{}
		r.Send(a, buf, 2)
		if err := r.Submit(got.add); err != nil {
			t.Fatal(err)
		}
		if got[2] == -int32(unix.EAGAIN) {
			break
		}
		if got[2] <= 0 {
			t.Fatalf("send gave %d", got[2])
		}
		sent += int(got[2])
	}
	// The peer reads it all, byte for byte, and then finds the end.
	unix.Shutdown(a, unix.SHUT_WR)
	read := 0
	for {
		got = results{}
		r.Recv(b, buf, 3)
		if err := r.Submit(got.add); err != nil {
			t.Fatal(err)
		}
		if got[3] == -int32(unix.EAGAIN) {
			continue // the rest is on its way
		}
		if got[3] < 0 {
			t.Fatalf("recv gave %d", got[3])
		}
		if got[3] == 0 {
			break
		}
		read += int(got[3])
	}
	if read != sent {
		t.Fatalf("read %d bytes, sent %d", read, sent)
	}
}

func TestSendToAGonePeerFailsWithoutASignal(t *testing.T) {
	r := newRing(t, 8)
	a, b := tcpPair(t)
	unix.SetsockoptLinger(b, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(b) // a reset
	failed := false
	for range 100 {
		got := results{}
		r.Send(a, []byte("hello"), 7)
		if err := r.Submit(got.add); err != nil {
			t.Fatal(err)
		}
		if got[7] < 0 && got[7] != -int32(unix.EAGAIN) {
			failed = true
			break
		}
	}
	if !failed {
		t.Fatal("sends to a reset connection kept succeeding")
	}
}

func TestAFullRingRefusesMore(t *testing.T) {
	r := newRing(t, 4)
	a, b := tcpPair(t)
	space := r.Space()
	if space < 4 {
		t.Fatalf("Space() = %d, want at least 4", space)
	}
	for i := range space {
		if !r.Send(a, []byte{byte('a' + i)}, uint64(i)) {
			t.Fatalf("send %d of %d refused", i, space)
		}
	}
	if r.Send(a, []byte("z"), 99) || r.Space() != 0 {
		t.Fatalf("a full ring took another operation (space %d)", r.Space())
	}
	if r.Send(a, nil, 98) {
		t.Fatal("an empty send was queued")
	}
	got := results{}
	if err := r.Submit(got.add); err != nil {
		t.Fatal(err)
	}
	if len(got) != space || r.Space() != space {
		t.Fatalf("%d results for %d operations; space after %d", len(got), space, r.Space())
	}
	buf := make([]byte, 64)
	n, err := unix.Read(b, buf)
	for err == nil && n < space {
		var m int
		m, err = unix.Read(b, buf[n:])
		n += m
	}
	want := "abcdefgh"[:space]
	if string(buf[:n]) != want {
		t.Fatalf("the peer got %q, want %q (in the order queued)", buf[:n], want)
	}
}

// TestRingsOnManyThreads runs a ring per goroutine, each on its own locked
// thread, at once: each sees only its own results (run with -race).
func TestRingsOnManyThreads(t *testing.T) {
	if _, err := New(2); err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	const workers, rounds = 16, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		a, b := tcpPair(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r, err := New(4)
			if err != nil {
				errs <- err
				return
			}
			defer r.Close()
			buf := make([]byte, 64)
			for i := range rounds {
				msg := fmt.Appendf(nil, "w%d-%d", w, i)
				got := results{}
				r.Send(a, msg, 1)
				if err := r.Submit(got.add); err != nil || got[1] != int32(len(msg)) {
					errs <- fmt.Errorf("worker %d: send %d: %v %d", w, i, err, got[1])
					return
				}
				for {
					got = results{}
					r.Recv(b, buf, 2)
					if err := r.Submit(got.add); err != nil {
						errs <- err
						return
					}
					if got[2] != -int32(unix.EAGAIN) {
						break
					}
				}
				if string(buf[:max(got[2], 0)]) != string(msg) {
					errs <- fmt.Errorf("worker %d: got %q, want %q", w, buf[:max(got[2], 0)], msg)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// BenchmarkSendAndReceive sends a 150-byte message on each of 20 loopback
// connections and reads it at the other end, as an event loop's pass
// would: one write(2) and one read(2) per socket, against one Submit for
// the sends and one for the receives. ns/op is per message. On a machine
// where system calls are dear the ring's op is a fraction of the other's.
func BenchmarkSendAndReceive(b *testing.B) {
	const conns = 20
	var ws, rs [conns]int
	for i := range conns {
		ws[i], rs[i] = tcpPair(b)
	}
	msg := bytes.Repeat([]byte{'m'}, 150)
	bufs := make([][]byte, conns)
	for i := range bufs {
		bufs[i] = make([]byte, 4096)
	}
	check := func(b *testing.B, what string, n int) {
		if n != len(msg) {
			b.Fatalf("%s gave %d", what, n)
		}
	}
	b.Run("one-by-one", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			k := i % conns
			n, err := unix.Write(ws[k], msg)
			if err != nil {
				b.Fatal(err)
			}
			check(b, "write", n)
			n, err = unix.Read(rs[k], bufs[k])
			if err != nil {
				b.Fatal(err)
			}
			check(b, "read", n)
		}
	})
	b.Run("ring", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		r, err := New(conns)
		if err != nil {
			b.Skipf("no io_uring here: %v", err)
		}
		defer r.Close()
		done := func(tag uint64, res int32) { check(b, "ring operation", int(res)) }
		for n := 0; b.Loop(); n++ {
			k := n % conns
			r.Send(ws[k], msg, uint64(k))
			if k == conns-1 { // a pass's worth: send them all, then read them all
				if err := r.Submit(done); err != nil {
					b.Fatal(err)
				}
				for j := range conns {
					r.Recv(rs[j], bufs[j], uint64(j))
				}
				if err := r.Submit(done); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := r.Submit(done); err != nil { // the last partial pass's sends
			b.Fatal(err)
		}
		for j := range conns { // and their messages, unread
			for {
				if _, err := unix.Read(rs[j], bufs[j]); err != nil {
					break
				}
			}
		}
	})
}
