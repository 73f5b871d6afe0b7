//go:build linux

package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/storemetrics"
	"github.com/fencegate/fencegate/internal/atomichist"
)

// BenchmarkLoopWrite measures one fenced write through the event loops, as
// fencegate serve runs them (memory store behind storemetrics, the
// binary's meter provider): a client on a kept-alive connection sends PUT
// /jobs/{n} with its token, the gate admits it at the high-water mark and
// forwards it to an upstream that answers 200 with a 3-byte body, and the
// answer comes back. Client and upstream are bare sockets that allocate
// nothing per request, so allocs/op is the gate's. The time per write is
// mostly the system calls of the three parties; usr-ns/op, the process's
// user CPU time per write, and the allocations are (nearly all) the
// gate's own:
//
//	go test -run '^$' -bench LoopWrite -benchmem ./proxy/
func BenchmarkLoopWrite(b *testing.B) {
	const resources = 64
	up := serveRawBench(b)
	st := memstore.New(memstore.Options{})
	toks := make([][]byte, resources)
	for i := range toks {
		l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: fmt.Sprintf("job:%d", i), Owner: "bench", TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		toks[i] = []byte(l.Token.String())
	}
	rules, err := ParseRules("PUT /jobs/{id} fence job:{id}")
	if err != nil {
		b.Fatal(err)
	}
	hists := atomichist.NewProducer()
	mp := &atomichist.MeterProvider{
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader(sdkmetric.WithProducer(hists)))),
		Histograms:    hists,
	}
	u, _ := url.Parse("http://" + up.Addr().String())
	g, err := New(Options{Upstream: u, Store: storemetrics.Wrap(st, mp, nil), Rules: rules, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	s := serveGate(b, g)
	c := blockingConn(b, s.Listener.Addr().String())
	reqs := make([][]byte, resources)
	for i := range reqs {
		reqs[i] = fmt.Appendf(nil, "PUT /jobs/%d HTTP/1.1\r\nHost: gate\r\nUser-Agent: bench\r\nContent-Type: application/json\r\nFencing-Token: %s\r\nContent-Length: 10\r\n\r\n{\"step\":1}", i, toks[i])
	}
	buf := make([]byte, 4096)
	b.ReportAllocs()
	b.ResetTimer()
	before := userTime(b)
	for i := range b.N {
		if _, err := c.Write(reqs[i%resources]); err != nil {
			b.Fatal(err)
		}
		if err := readAnswer(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((userTime(b)-before).Nanoseconds())/float64(b.N), "usr-ns/op")
}

// userTime is the CPU time the process has spent in user mode: with one
// connection and no batching, its growth per write is the gate's own work
// (the bare client and upstream add little), much steadier between runs
// than the wall time.
func userTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano())
}

// readAnswer reads one response with a Content-Length body from c, and
// fails on anything but 200.
func readAnswer(c io.Reader, buf []byte) error {
	n := 0
	for {
		m, err := c.Read(buf[n:])
		if err != nil {
			return err
		}
		n += m
		end := bytes.Index(buf[:n], []byte("\r\n\r\n"))
		if end < 0 {
			continue
		}
		if !bytes.HasPrefix(buf, []byte("HTTP/1.1 200 ")) {
			return fmt.Errorf("answer %q", buf[:n])
		}
		i := bytes.Index(buf[:end], []byte("Content-Length: "))
		if i < 0 {
			return fmt.Errorf("answer without Content-Length: %q", buf[:n])
		}
		line := buf[i+len("Content-Length: ") : end+2]
		cl, err := strconv.Atoi(string(line[:bytes.IndexByte(line, '\r')]))
		if err != nil {
			return err
		}
		if n >= end+4+cl {
			return nil
		}
	}
}

// blockingConn dials addr and returns the connection as a blocking
// descriptor, read and written with plain system calls: no poller, no
// goroutine hand-offs, so that it costs the process little user time.
func blockingConn(b *testing.B, addr string) *os.File {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	return blocking(b, nc)
}

// blocking is nc as a blocking descriptor (nc itself is closed); it is
// closed when the benchmark ends.
func blocking(b *testing.B, nc net.Conn) *os.File {
	f, err := nc.(*net.TCPConn).File() // a duplicate, in blocking mode
	nc.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return f
}

// serveRawBench is an upstream for benchmarks: each request (a head and a
// Content-Length body) is answered 200 with "ok\n", without allocating.
func serveRawBench(b *testing.B) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	answer := []byte("HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Tue, 01 Dec 2026 08:00:00 GMT\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nok\n")
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			c := blocking(b, nc)
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				n := 0
				for {
					m, err := c.Read(buf[n:])
					if err != nil {
						return
					}
					n += m
					for {
						end := bytes.Index(buf[:n], []byte("\r\n\r\n"))
						if end < 0 {
							break
						}
						cl := 0
						if i := bytes.Index(buf[:end], []byte("Content-Length: ")); i >= 0 {
							line := buf[i+len("Content-Length: ") : end+2]
							cl, _ = strconv.Atoi(string(line[:bytes.IndexByte(line, '\r')]))
						}
						if n < end+4+cl {
							break
						}
						n = copy(buf, buf[end+4+cl:n])
						if _, err := c.Write(answer); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return ln
}
