//go:build linux

package proxy

import (
	"crypto/tls"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/connlimit"
)

// TestTLSPumpStopsReadingAClientThatDoesNotRead: a pump whose client
// does not read (its socket full) reads that client while the ciphertext
// waiting for it is within maxPendingToClient, and not beyond: decrypting
// can write by itself (the answer to each TLS 1.3 KeyUpdate the client
// sends), so a client that sends and never reads must not make the gate
// hold its answers without end. Judged from the client's socket: whether
// the bytes the client sent were taken from it.
func TestTLSPumpStopsReadingAClientThatDoesNotRead(t *testing.T) {
	for _, tc := range []struct {
		pending int
		read    bool
	}{
		{maxPendingToClient, true},
		{maxPendingToClient + 1, false},
	} {
		e := &loopEngine{lnFD: -1, s: &Server{limit: connlimit.NewCounter(0, 0, 0)}}
		l, err := newEventLoop(e)
		if err != nil {
			t.Fatal(err)
		}
		client := socketPair(t) // [0] the client, [1] the pump's side of its TCP socket
		pair := socketPair(t)   // [0] the loop's end, [1] the pump's
		p := &tlsPump{e: e, l: l, idle: time.Hour, toClient: make([]byte, tc.pending)}
		p.tcp.FD, p.pair.FD = client[1], pair[1]
		p.tc = tls.Server(&tlsConnIO{p: p}, &tls.Config{})
		// The client's socket is readable, and full for writing.
		p.tcp.Readable, p.pair.Writable = true, true
		if _, err := unix.Write(client[0], []byte("\x17\x03\x03\x00\x05hello")); err != nil {
			t.Fatal(err)
		}
		p.run()
		if p.stall != nil {
			p.stall.Stop()
		}
		_, err = unix.Read(client[1], make([]byte, 64))
		if taken := err == unix.EAGAIN; taken != tc.read {
			t.Errorf("%d bytes waiting for the client: its input taken %v (read: %v), want %v", tc.pending, taken, err, tc.read)
		}
		l.p.Close()
	}
}

// socketPair is a connected pair of non-blocking Unix stream sockets,
// closed when t ends.
func socketPair(t *testing.T) [2]int {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return [2]int(fds)
}
