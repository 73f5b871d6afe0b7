package connlimit_test

import (
	"bytes"
	"io"
	"net"
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
		counter := connlimit.NewCounter(1, 0)
		counter.Acquire() // the one connection allowed is taken
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
