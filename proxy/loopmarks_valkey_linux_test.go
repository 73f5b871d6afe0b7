//go:build linux

package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/redcon"

	"github.com/fencegate/fencegate/fencing/valkeystore"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
	"github.com/fencegate/fencegate/internal/syncbuf"
)

// markFront stands between a Valkey store and its server: it relays the
// store's client connections (valkey-go's, whose first command is HELLO)
// to the server, and answers every other connection (a loop's mark
// reader) itself: intro to each introduction command (CLIENT SETNAME),
// reply to each HMGET.
type markFront struct {
	ln             net.Listener
	target         string
	intro, reply   atomic.Pointer[string]
	intros, hmgets atomic.Int64 // commands the front answered
	wg             sync.WaitGroup
	mu             sync.Mutex
	conns          []net.Conn
}

func newMarkFront(t *testing.T, target string) *markFront {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &markFront{ln: ln, target: target}
	ok := "+OK\r\n"
	f.intro.Store(&ok)
	f.reply.Store(&ok)
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.track(c)
			f.wg.Go(func() { f.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			_ = c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *markFront) track(c net.Conn) {
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
}

func (f *markFront) serve(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 32<<10)
	n, err := c.Read(buf)
	if err != nil {
		return
	}
	in := append([]byte(nil), buf[:n]...)
	if bytes.Contains(bytes.ToUpper(in[:min(len(in), 32)]), []byte("HELLO")) {
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			return
		}
		f.track(s)
		defer s.Close()
		if _, err := s.Write(in); err != nil {
			return
		}
		f.wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
		_, _ = io.Copy(s, c)
		return
	}
	for {
		var out []byte
		for {
			complete, args, _, rest, err := redcon.ReadNextCommand(in, nil)
			if err != nil || !complete {
				break
			}
			in = rest
			if strings.EqualFold(string(args[0]), "HMGET") {
				f.hmgets.Add(1)
				out = append(out, *f.reply.Load()...)
			} else {
				f.intros.Add(1)
				out = append(out, *f.intro.Load()...)
			}
		}
		if _, err := c.Write(out); err != nil {
			return
		}
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		in = append(in, buf[:n]...)
	}
}

// TestLoopMarkReaderMalformedValkey: a gate on a Valkey store whose
// server answers a loop's mark reader with a bulk string of 2^63-1 bytes
// (on which redcon's parser panics), to its CLIENT SETNAME or to its
// HMGET, keeps serving: the reader fails as a protocol error, at once
// (the store's command timeout is a minute, beyond the client's), no
// panic is contained or escapes (one on the goroutine opening the reader
// would end the test binary), and every write is admitted through the
// store's client, answered 200 and forwarded once.
func TestLoopMarkReaderMalformedValkey(t *testing.T) {
	const huge = "$9223372036854775807\r\n"
	for _, at := range []string{"intro", "reply"} {
		t.Run(at, func(t *testing.T) {
			srv := valkeytest.Start(t)
			front := newMarkFront(t, srv.Addr())
			bad := huge
			answered := &front.intros
			if at == "intro" {
				front.intro.Store(&bad)
			} else {
				front.reply.Store(&bad)
				answered = &front.hmgets
			}
			st, err := valkeystore.Open(context.Background(), valkeystore.Options{URL: "valkey://" + front.ln.Addr().String(),
				KeyPrefix: fmt.Sprintf("markfront%d", time.Now().UnixNano()), CommandTimeout: time.Minute, DialTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			var logs syncbuf.Buffer
			e, write, writes := loopWriter(t, st, slog.NewTextHandler(&logs, nil))
			// The first write raises the mark and has the loop open its
			// reader; the writes at the mark go to it once it is open.
			for end := time.Now().Add(10 * time.Second); answered.Load() == 0; {
				if time.Now().After(end) {
					t.Fatalf("the front answered no %s of a mark reader", at)
				}
				write()
			}
			waitFor(t, "the reader's failure to be logged", func() bool { return strings.Contains(logs.String(), "mark reader failed") })
			for range 3 {
				write()
			}
			if n := e.up.count(); n != *writes {
				t.Fatalf("the upstream got %d writes, want the %d answered 200", n, *writes)
			}
			if n := e.gate.tel.panics.Load(); n != 0 {
				t.Fatalf("%d panics contained; log:\n%s", n, logs.String())
			}
			if !strings.Contains(logs.String(), "not a RESP2 reply") {
				t.Fatalf("the reader did not fail on a protocol error; log:\n%s", logs.String())
			}
		})
	}
}
