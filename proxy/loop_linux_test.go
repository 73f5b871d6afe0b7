//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/logwriter"
	"github.com/fencegate/fencegate/internal/uring"
)

// newLeasedUpstream starts a raw upstream and a memory store holding a
// lease on job:1, for a gate in front of them.
func newLeasedUpstream(t *testing.T) (*rawUpstream, *url.URL, *memstore.Store, fencing.Lease) {
	t.Helper()
	up := newRawUpstream(t)
	u, _ := url.Parse("http://" + up.ln.Addr().String())
	st := memstore.New(memstore.Options{})
	l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:1", Owner: "o", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return up, u, st, l
}

// newLeasedGate is a gate with the test rules in front of a raw upstream
// and a memory store holding a lease on job:1 (see newLeasedUpstream).
func newLeasedGate(t *testing.T) (*rawUpstream, fencing.Lease, *Gate) {
	t.Helper()
	up, u, st, l := newLeasedUpstream(t)
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: st, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	return up, l, g
}

// serveLeasedGate serves a gate with the test rules in front of a raw
// upstream and a memory store holding a lease on job:1 (see
// newLeasedUpstream), once its event loops run.
func serveLeasedGate(t *testing.T) (*rawUpstream, fencing.Lease, *gateServer) {
	t.Helper()
	up, l, g := newLeasedGate(t)
	gs := serveGate(t, g)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	return up, l, gs
}

// TestLoopsServeTheListener: on Linux a TCP listener is served by the
// event loops, which keep plain requests and hand a connection to the
// fallback server only when a request needs it (here a chunked body).
func TestLoopsServeTheListener(t *testing.T) {
	up, l, gs := serveLeasedGate(t)
	e := gs.srv.engine()
	handed := func() int { return len(e.handedConns()) }
	ask := func(raw string) net.Conn {
		c, err := net.Dial("tcp", gs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%q: %v %v", raw, resp, err)
		}
		return c
	}
	ask("PUT /jobs/1 HTTP/1.1\r\nHost: g\r\nFencing-Token: " + tok(l.Token) + "\r\nContent-Length: 1\r\n\r\nx")
	if n := handed(); n != 0 {
		t.Fatalf("%d connections handed off after a plain request", n)
	}
	ask("PUT /jobs/1 HTTP/1.1\r\nHost: g\r\nFencing-Token: " + tok(l.Token) + "\r\nTransfer-Encoding: chunked\r\n\r\n1\r\ny\r\n0\r\n\r\n")
	if n := handed(); n != 1 {
		t.Fatalf("%d connections handed off after a chunked request, want 1", n)
	}
	if got := up.take(); len(got) != 2 || !strings.HasSuffix(got[0], "\r\n\r\nx") || !strings.Contains(got[1], "Transfer-Encoding: chunked") {
		t.Fatalf("the upstream got %q", got)
	}
}

// TestLoopUpstreamBreaksOff: when the upstream closes in the middle of a
// response body, the client's connection is closed too, at once: it
// cannot take the short body for a whole one.
func TestLoopUpstreamBreaksOff(t *testing.T) {
	c := dialGateBefore(t, func(up net.Conn) {
		_, _ = io.WriteString(up, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
	})
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if string(body) != "only ten b" || err != io.ErrUnexpectedEOF {
		t.Fatalf("got %q, %v; want the ten bytes, then the connection closed", body, err)
	}
}

// TestLoopSlowReaderBoundsMemory: a client that reads a large answer
// slowly holds the loop's relay to the client's pace, not the upstream's:
// the gate never holds much more than one read of it.
func TestLoopSlowReaderBoundsMemory(t *testing.T) {
	const size = 64 << 20
	c := dialGateBefore(t, func(up net.Conn) {
		fmt.Fprintf(up, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
		_, _ = io.Copy(up, &patternReader{n: size})
	})
	_ = c.(*net.TCPConn).SetReadBuffer(16 << 10)
	if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	var before, peak runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	buf := make([]byte, 256<<10)
	var n int64
	sum := sha256.New()
	for i := 0; ; i++ {
		m, err := resp.Body.Read(buf)
		n += int64(m)
		sum.Write(buf[:m])
		if err != nil {
			break
		}
		if i%64 == 0 {
			time.Sleep(time.Millisecond) // a slow reader
			runtime.GC()                 // what the gate holds, not its garbage
			runtime.ReadMemStats(&peak)
			if grown := int64(peak.HeapInuse) - int64(before.HeapInuse); grown > 16<<20 {
				t.Fatalf("the gate's heap grew by %d MiB while relaying", grown>>20)
			}
		}
	}
	if n != size || hex.EncodeToString(sum.Sum(nil)) != patternSum(size) {
		t.Fatalf("relayed %d bytes (want %d), or not the upstream's", n, size)
	}
}

// TestLoopsBatchThroughIOUring: where the test's kernel gives an io_uring,
// every loop has one (made on its own thread), and a server told not to
// use it (ServerOptions.NoIOURing, FENCEGATE_IO_URING=false) has none.
func TestLoopsBatchThroughIOUring(t *testing.T) {
	if r, err := uring.New(2); err != nil {
		t.Skipf("no io_uring here: %v", err)
	} else {
		_ = r.Close()
	}
	for _, plainIO := range []bool{false, true} {
		_, u, st, _ := newLeasedUpstream(t)
		g, err := New(Options{Upstream: u, Store: st})
		if err != nil {
			t.Fatal(err)
		}
		gs := serveGateWith(t, g, ServerOptions{NoIOURing: plainIO})
		resp, err := http.Get(gs.URL + "/r")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for i, l := range gs.srv.loops.Load().loops {
			var has bool
			l.call(func() { has = l.batchIO.ring != nil })
			if has == plainIO {
				t.Errorf("plain I/O %v: loop %d has a ring: %v", plainIO, i, has)
			}
		}
	}
}

// TestLoopReadsAheadAtMostOnce: a client that keeps sending pipelined
// requests while its first one waits for the upstream does not make the
// gate buffer them: the loop reads a socket ahead of its connection's
// steps only while nothing read before waits. Sent in small pieces (each
// one a new readiness event), the gate holds at most one read ahead of
// them; sent in bulk, the client's writes block once the kernel's buffers
// are full. The first answer then comes whole.
func TestLoopReadsAheadAtMostOnce(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	gs := serveGateBefore(t, func(up net.Conn) {
		<-release
		_, _ = io.WriteString(up, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
	})
	c, err := net.Dial("tcp", gs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /first HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	held := func() int { // bytes the loops hold unread from their clients
		n := 0
		for _, l := range gs.srv.loops.Load().loops {
			l.call(func() {
				for lc := range l.clients {
					n += len(lc.In)
				}
			})
		}
		return n
	}
	piece := []byte(strings.Repeat("GET /flood HTTP/1.1\r\nHost: g\r\n\r\n", 30)) // about 1 KiB
	for range 500 {
		if _, err := c.Write(piece); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := held(); n > loopAheadRead {
		t.Fatalf("the gate holds %d bytes of pipelined requests behind one waiting for the upstream (at most %d)", n, loopAheadRead)
	}
	const limit = 64 << 20
	bulk := bytes.Repeat(piece, 64)
	written := 0
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	for written < limit {
		n, err := c.Write(bulk)
		written += n
		if err != nil {
			break // blocked until the deadline: the gate stopped reading
		}
	}
	if n := held(); written >= limit || n > loopAheadRead {
		t.Fatalf("the client wrote %d MiB of pipelined requests in bulk; the gate holds %d bytes", written>>20, n)
	}
	open()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 5))
	if resp.StatusCode != http.StatusOK || string(body) != "first" || err != nil {
		t.Fatalf("first answer: %d %q %v", resp.StatusCode, body, err)
	}
}

// dialGateBefore serves a gate in front of an upstream that answers each
// request with answer (see serveGateBefore); it returns a connection to
// the gate, made once its event loops serve.
func dialGateBefore(t *testing.T, answer func(up net.Conn)) net.Conn {
	t.Helper()
	gs := serveGateBefore(t, answer)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	c, err := net.Dial("tcp", gs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// serveGateBefore serves a gate (memory store, no rules) in front of an
// upstream that reads each request and answers it with answer, then
// closes.
func serveGateBefore(t *testing.T, answer func(up net.Conn)) *gateServer {
	t.Helper()
	upLn := serveRaw(t, func(up net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(up)); err == nil {
			answer(up)
		}
		up.Close()
	})
	u, _ := url.Parse("http://" + upLn.Addr().String())
	g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	return serveGate(t, g)
}

// TestClientGoneMidWriteOnTheLoops: a client that hangs up after its
// fenced write reached the upstream, before the answer, frees nothing: the
// write stays in flight at the barrier until the upstream answers (the
// loops do not watch a client while its request is with the upstream), so
// a higher token waits (here until its barrier timeout) and passes only
// after that answer; the write is counted admitted, by its outcome. Read
// from the upstream's record.
func TestClientGoneMidWriteOnTheLoops(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	e := newEnv(t, testRules, func(o *Options) {
		o.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		o.BarrierTimeout = 50 * time.Millisecond
		o.TimeoutGrace = time.Hour
	})
	arrived, release := make(chan struct{}), make(chan struct{})
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		if rec.Body == "slow" {
			close(arrived)
			<-release
		}
		return false
	}
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()
	a := e.acquire("job:1", "a", 10*time.Second)
	e.clock.Advance(11 * time.Second)
	b := e.acquire("job:1", "b", 10*time.Second)

	c, err := net.Dial("tcp", e.gateSrv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(c, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: %d\r\nContent-Length: 4\r\n\r\nslow", a.Token); err != nil {
		t.Fatal(err)
	}
	<-arrived
	c.Close()
	for range 3 { // each a full barrier timeout after the hang-up
		wantProblem(t, e.do("PUT", "/jobs/1", "early", HeaderToken, tok(b.Token)), 503, "barrier-timeout")
	}
	releaseOnce()
	waitFor(t, "the barrier to empty", func() bool { return e.gate.InFlightResources() == 0 })
	if r := e.do("PUT", "/jobs/1", "after", HeaderToken, tok(b.Token)); r.Status != 200 {
		t.Fatalf("the higher token after the answer: %d %s", r.Status, r.Body)
	}
	got := e.up.requests()
	if len(got) != 2 || got[0].Body != "slow" || got[1].Body != "after" {
		t.Fatalf("the upstream got %+v, want the gone client's write, then the higher token's", got)
	}
	// Counted by outcome: the gone client's write was answered.
	if got, want := writeCounts(t, reader), "admitted PUT=2\nbarrier-timeout PUT=3"; got != want {
		t.Fatalf("fencegate.gate.writes\n got:\n%s\nwant:\n%s", got, want)
	}
}

// countingBatch is a logwriter.Writer that counts how often it was held
// and checks that every Hold is matched by one Release.
type countingBatch struct {
	*logwriter.Writer
	holds, open atomic.Int64
}

func (b *countingBatch) Hold()    { b.holds.Add(1); b.open.Add(1); b.Writer.Hold() }
func (b *countingBatch) Release() { b.open.Add(-1); b.Writer.Release() }

// TestLoopsGatherTheAuditLinesOfAPass: with Options.LogBatch, the event
// loops hold the log's output for each pass, and every write's audit line
// still reaches it, whole and once, at the end of the pass that answered
// the write.
func TestLoopsGatherTheAuditLinesOfAPass(t *testing.T) {
	up, u, st, l := newLeasedUpstream(t)
	var mu sync.Mutex
	var out bytes.Buffer
	lw := logwriter.New(logOutput(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(p) == 0 || p[len(p)-1] != '\n' {
			t.Errorf("a write of %d bytes to the log ends inside a line: %q", len(p), p)
		}
		return out.Write(p)
	}))
	batch := &countingBatch{Writer: lw}
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: st, Rules: rules, LogBatch: batch,
		Logger: slog.New(slog.NewJSONHandler(lw, nil))})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	const clients, writes = 8, 25
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			c := gs.Client()
			for range writes {
				if !writeJob1(t, gs, c, l.Token, "x") {
					return
				}
			}
		})
	}
	wg.Wait()
	logged := func() (lines, admitted int, text string) {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(out.String(), `"msg":"gate write"`), strings.Count(out.String(), `"code":"admitted"`), out.String()
	}
	// A write's line goes out at the end of the pass that answered it.
	waitFor(t, "every audit line", func() bool { n, _, _ := logged(); return n >= clients*writes })
	if lines, admitted, text := logged(); lines != clients*writes || admitted != clients*writes {
		t.Fatalf("%d audit lines (%d admitted) for %d writes:\n%s", lines, admitted, clients*writes, text)
	}
	if n := len(up.take()); n != clients*writes {
		t.Fatalf("the upstream got %d writes, want %d", n, clients*writes)
	}
	if batch.holds.Load() == 0 {
		t.Fatal("the loops never held the log")
	}
	waitFor(t, "every pass to release the log", func() bool { return batch.open.Load() == 0 })
}

// TestLoopsGoOnWhenTheRingFails: when a loop's io_uring fails (here every
// loop's ring is swapped, mid-run, for one bound to another thread, whose
// submits the kernel refuses), the loop drops it and goes on with one
// system call per read and write: every write is answered 200 and reaches
// the upstream exactly once, none is lost or sent twice. Read from the
// upstream's record.
func TestLoopsGoOnWhenTheRingFails(t *testing.T) {
	up, l, gs := serveLeasedGate(t)
	loops := gs.srv.loops.Load().loops
	rings := func() (n int) {
		for _, lp := range loops {
			lp.call(func() {
				if lp.batchIO.ring != nil {
					n++
				}
			})
		}
		return n
	}
	if rings() == 0 {
		t.Skip("no io_uring here")
	}
	const clients, writes = 8, 40
	var done atomic.Int32
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		waitFor(t, "half the writes", func() bool { return done.Load() >= clients*writes/2 })
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for _, lp := range loops {
			foreign, err := uring.New(8) // bound to this thread
			if err != nil {
				t.Error(err)
				return
			}
			lp.call(func() {
				if lp.batchIO.ring == nil {
					_ = foreign.Close()
					return
				}
				_ = lp.batchIO.ring.Close()
				lp.batchIO.ring = foreign
			})
		}
	}()
	want := map[string]bool{}
	for i := range clients {
		for j := range writes {
			want[fmt.Sprintf("w-%d-%d", i, j)] = true
		}
	}
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			c := gs.Client()
			for j := range writes {
				if !writeJob1(t, gs, c, l.Token, fmt.Sprintf("w-%d-%d", i, j)) {
					return
				}
				done.Add(1)
				if j == writes/2 {
					<-swapped // the rest after the swap
				}
			}
		})
	}
	wg.Wait()
	got := map[string]int{}
	for _, r := range up.take() {
		got[r[strings.LastIndex(r, "\r\n\r\n")+4:]]++
	}
	for body := range want {
		if got[body] != 1 {
			t.Errorf("the upstream got write %s %d times", body, got[body])
		}
	}
	if len(got) != len(want) {
		t.Errorf("the upstream got %d distinct writes, want %d", len(got), len(want))
	}
	if n := rings(); n != 0 {
		t.Skipf("%d loops still have a ring: this kernel does not bind a ring to its thread, so no failure was injected", n)
	}
}

// writeJob1 sends a fenced write of body to job:1 through gs with token,
// and reports an error unless it is answered 200; false when it got no
// answer at all.
func writeJob1(t *testing.T, gs *gateServer, c *http.Client, token fencing.Token, body string) bool {
	req, _ := http.NewRequest(http.MethodPut, gs.URL+"/jobs/1", strings.NewReader(body))
	req.Header.Set("Fencing-Token", tok(token))
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("write %q answered %d", body, resp.StatusCode)
	}
	return true
}

type logOutput func([]byte) (int, error)

func (f logOutput) Write(p []byte) (int, error) { return f(p) }

// TestLoopsSurviveAnOverflowingChunkSize: an upstream answer whose chunk
// size does not fit in 63 bits (2^63, with leading zeros too) cuts that
// answer off and nothing else: the same gate goes on answering.
func TestLoopsSurviveAnOverflowingChunkSize(t *testing.T) {
	for _, size := range []string{"8000000000000000", "800000000000000f", "00000008000000000000000"} {
		t.Run(size, func(t *testing.T) {
			gs := serveGateBefore(t, func(up net.Conn) {
				io.WriteString(up, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+size+"\r\nabc")
			})
			waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
			for i := range 2 {
				c, err := net.Dial("tcp", gs.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if _, err := io.ReadAll(resp.Body); err == nil {
					t.Fatalf("request %d: the body was relayed whole; want it cut off", i)
				}
			}
		})
	}
}

// TestLoopsAnswerABareLFHeadAtOnce: an upstream answer whose head ends its
// lines with a bare LF, on a connection the upstream keeps open, is
// refused at once (502), not waited on until the upstream timeout: such a
// head never ends in CRLF CRLF.
func TestLoopsAnswerABareLFHeadAtOnce(t *testing.T) {
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	c := dialGateBefore(t, func(up net.Conn) {
		_, _ = io.WriteString(up, "HTTP/1.1 200 OK\nContent-Length: 2\n\nok")
		<-hold // the connection stays open
	})
	if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: g\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // the upstream timeout is longer
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	wantRawProblem(t, resp, http.StatusBadGateway, "upstream-unavailable")
}

// TestLoopsReuseTheUpstreamConnectionUsedLast: after a burst opened
// several upstream connections, one client's requests in turn all go over
// one of them (the one used last, as nginx's keepalive and net/http pick),
// not round the whole pool: at low load the connection in use stays warm,
// and the surplus goes idle and is closed after upstreamIdle. Judged from
// the upstream's record of the connection each request came on.
func TestLoopsReuseTheUpstreamConnectionUsedLast(t *testing.T) {
	var (
		mu    sync.Mutex
		conns []string // the upstream connection (peer address) of each request
	)
	hold := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns = append(conns, r.RemoteAddr)
		mu.Unlock()
		if r.URL.Path == "/hold" {
			<-hold
		}
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{}), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })

	// A burst: burst reads held at the upstream at once, each on a client
	// connection and an upstream connection of its own.
	burst := 4 * loopCount(0, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := c.Get(gs.URL + "/hold")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		})
	}
	waitFor(t, "the burst to reach the upstream", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(conns) == burst
	})
	close(hold)
	wg.Wait()

	mu.Lock()
	conns = nil
	mu.Unlock()
	c := &http.Client{Transport: &http.Transport{}}
	for range 12 {
		resp, err := c.Get(gs.URL + "/one")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	used := map[string]bool{}
	for _, a := range conns {
		used[a] = true
	}
	if len(conns) != 12 || len(used) != 1 {
		t.Fatalf("12 requests in turn reached the upstream as %d requests over %d connections, want one connection: %v", len(conns), len(used), conns)
	}
}

// TestSpareProcessorCountsTheCPUsOnce: with SpareProcessor, the first
// listener's loops raise GOMAXPROCS to one more than they are, and a
// second listener in the same process still runs one loop per CPU (not
// one per processor, the spare one included), without raising it again.
// Not parallel: it changes the test process's GOMAXPROCS, and restores it.
func TestSpareProcessorCountsTheCPUsOnce(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set: the spare processor leaves it alone")
	}
	procs := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(procs)
		spare.Lock()
		spare.before, spare.set = 0, 0
		spare.Unlock()
	})
	_, _, g := newLeasedGate(t)
	for i := range 2 {
		gs := serveGateWith(t, g, ServerOptions{SpareProcessor: true})
		waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
		if n := len(gs.srv.engine().loops); n != procs {
			t.Errorf("listener %d: %d loops, want %d (one per CPU)", i+1, n, procs)
		}
		if got := runtime.GOMAXPROCS(0); got != procs+1 {
			t.Errorf("after listener %d: GOMAXPROCS %d, want %d (the loops and one to spare)", i+1, got, procs+1)
		}
	}
	// A GOMAXPROCS the program sets itself afterwards is its count.
	runtime.GOMAXPROCS(procs + 2)
	gs := serveGateWith(t, g, ServerOptions{SpareProcessor: true})
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	if n := len(gs.srv.engine().loops); n != procs+2 {
		t.Errorf("after GOMAXPROCS(%d): %d loops, want %d", procs+2, n, procs+2)
	}
	if got := runtime.GOMAXPROCS(0); got != procs+3 {
		t.Errorf("after GOMAXPROCS(%d) and a listener: GOMAXPROCS %d, want %d", procs+2, got, procs+3)
	}
}

// TestLoopsOption: ServerOptions.Loops sets how many event loops serve the
// listener (FENCEGATE_LOOPS), zero leaving it to loopCount; connections
// are dealt out to every loop, and each write reaches the upstream once,
// read from its record.
func TestLoopsOption(t *testing.T) {
	if got := loopCount(0, 8); got != 8 {
		t.Errorf("loopCount(0, 8) = %d, want 8 (one per CPU)", got)
	}
	if got := loopCount(3, 8); got != 3 {
		t.Errorf("loopCount(3, 8) = %d, want the 3 asked for", got)
	}
	if got := loopCount(0, 1); got != 1 {
		t.Errorf("loopCount(0, 1) = %d, want 1", got)
	}
	up, l, g := newLeasedGate(t)
	const loops = 3
	gs := serveGateWith(t, g, ServerOptions{Loops: loops})
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	if n := len(gs.srv.engine().loops); n != loops {
		t.Fatalf("%d loops serve the listener, want %d", n, loops)
	}
	const clients = 2 * loops
	var conns []net.Conn
	for i := range clients {
		c, err := net.Dial("tcp", gs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		body := strconv.Itoa(i)
		if _, err := io.WriteString(c, "PUT /jobs/1 HTTP/1.1\r\nHost: g\r\nFencing-Token: "+tok(l.Token)+
			"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("write %d: %v %v", i, resp, err)
		}
		conns = append(conns, c)
	}
	for i, lp := range gs.srv.engine().loops {
		var n int
		lp.call(func() { n = len(lp.clients) })
		if n == 0 {
			t.Errorf("loop %d serves none of %d open connections", i, len(conns))
		}
	}
	got := up.take()
	seen := map[string]int{}
	for _, r := range got {
		seen[r[strings.LastIndex(r, "\r\n\r\n")+4:]]++
	}
	for i := range clients {
		if n := seen[strconv.Itoa(i)]; n != 1 {
			t.Errorf("write %d reached the upstream %d times, want once", i, n)
		}
	}
	if len(got) != clients {
		t.Errorf("the upstream got %d requests, want %d", len(got), clients)
	}
}

// TestIdleLoopSleepsUntilItsNextDeadline: a loop with nothing to do sleeps
// until the earliest deadline of its connections (here a keep-alive
// client's idle timeout), at most loopIdleMax, rather than waking every
// loopTick; the deadline still fires, and while a request waits for an
// upstream connection (which only the sweep hands it) or a batch is out on
// its mark reader (which only the sweep finds overdue) the loop still wakes
// every loopTick. Wake-ups are counted in passes.
func TestIdleLoopSleepsUntilItsNextDeadline(t *testing.T) {
	up, l, g := newLeasedGate(t)
	const idle = 400 * time.Millisecond
	gs := serveGateWith(t, g, ServerOptions{Loops: 1, IdleTimeout: idle})
	waitFor(t, "the server to start", func() bool { return gs.srv.engine() != nil })
	lp := gs.srv.engine().loops[0]
	onLoop := func(f func()) { t.Helper(); lp.call(f) }

	var before time.Duration
	onLoop(func() { before = lp.idleWait() })
	if before != loopIdleMax {
		t.Errorf("a loop without connections sleeps %v, want loopIdleMax (%v)", before, loopIdleMax)
	}

	c, err := net.Dial("tcp", gs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	sent := time.Now() // the gate's idle deadline is set after this
	if _, err := io.WriteString(c, "PUT /jobs/1 HTTP/1.1\r\nHost: g\r\nFencing-Token: "+tok(l.Token)+"\r\nContent-Length: 1\r\n\r\nx"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("write: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if got := up.take(); len(got) != 1 {
		t.Fatalf("the upstream received %d requests, want 1", len(got))
	}

	// The client now waits between requests: the loop sleeps until its
	// idle deadline, not a whole loopIdleMax.
	var wait time.Duration
	var conns int
	onLoop(func() { wait, conns = lp.idleWait(), len(lp.clients) })
	if conns != 1 {
		t.Fatalf("the loop holds %d client connections, want 1", conns)
	}
	if wait > idle+time.Millisecond || wait < loopTick {
		t.Errorf("with a client idle until %v from now, the loop sleeps %v", idle, wait)
	}
	onLoop(func() {
		saved := lp.pool.waiting
		lp.pool.waiting = append(saved[:len(saved):len(saved)], &loopConn{})
		wait = lp.idleWait()
		lp.pool.waiting = saved
	})
	if wait != loopTick {
		t.Errorf("with a request waiting for an upstream connection, the loop sleeps %v, want loopTick (%v)", wait, loopTick)
	}
	onLoop(func() {
		saved := lp.marks.conn
		lp.marks.conn = &markConn{l: lp, batch: make([]pendingAdmit, 1)}
		wait = lp.idleWait()
		lp.marks.conn = saved
	})
	if wait != loopTick {
		t.Errorf("with a batch out on its mark reader (which the sweep finds overdue), the loop sleeps %v, want loopTick (%v)", wait, loopTick)
	}

	// Asleep, the loop runs a few passes over a window of many loopTicks,
	// not one a tick.
	window := 15 * loopTick
	var p0, p1 uint64
	onLoop(func() { p0 = lp.passes })
	time.Sleep(window)
	onLoop(func() { p1 = lp.passes })
	if n := p1 - p0; n > 5 {
		t.Errorf("an idle loop ran %d passes in %v (a wake-up every loopTick would be %d)", n, window, window/loopTick)
	}

	// The idle deadline fires all the same: the gate closes the connection.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the idle connection was not closed by the gate: %v", err)
	}
	if d := time.Since(sent); d < idle {
		t.Errorf("the idle connection was closed %v after its request, before its idle timeout %v", d, idle)
	}
}
