//go:build linux

package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/valkeystore"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
	"github.com/fencegate/fencegate/internal/syncbuf"
)

// deafBatch is a memory store seen through a batch path (as the loops
// admit with the Valkey store) whose batches wait until hold is closed,
// then admit regardless of their context: a store that ignores
// cancellation (a driver without it, a frozen file system). admitted
// counts the writes it admitted.
type deafBatch struct {
	fencing.Store
	hold     chan struct{}
	admitted atomic.Int64
}

func (b *deafBatch) AdmitBatch(ctx context.Context, reqs []fencing.AdmitRequest, out []fencing.Admission, errs []error) {
	<-b.hold
	for i := range reqs {
		out[i], errs[i] = b.Admit(context.WithoutCancel(ctx), reqs[i])
		if errs[i] == nil {
			b.admitted.Add(1)
		}
	}
}

// TestLoopStopHonoursItsContext: a write's admission hangs in a store
// that ignores cancellation while the server is closed with a short
// context. CloseContext returns ctx's error once the context ends, not
// once the admission does (it never would here), and logs once what it
// left. When the store then admits the write, the write is not forwarded
// (the upstream's record stays empty) and its barrier place is left. With
// time left instead, CloseContext waits for the admission and returns
// with the place left.
func TestLoopStopHonoursItsContext(t *testing.T) {
	for _, timeLeft := range []bool{false, true} {
		t.Run(fmt.Sprintf("time left %v", timeLeft), func(t *testing.T) {
			var logs syncbuf.Buffer
			clock := newFakeClock()
			st := &deafBatch{Store: memstore.New(memstore.Options{Clock: clock}), hold: make(chan struct{})}
			e := newEnvStore(t, testRules, st, clock, func(o *Options) {
				o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			waitFor(t, "the server to start", func() bool { return e.gateSrv.srv.engine() != nil })
			l := e.acquire("job:1", "w", time.Hour)
			sendHeldWrite(t, e, l.Token)

			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			if timeLeft {
				ctx, cancel = context.WithCancel(context.Background())
			}
			defer cancel()
			closed := make(chan error, 1)
			go func() { closed <- e.gateSrv.srv.CloseContext(ctx) }()
			if timeLeft {
				select {
				case err := <-closed:
					t.Fatalf("CloseContext returned (%v) while an admission was still running", err)
				case <-time.After(100 * time.Millisecond):
				}
				close(st.hold)
			}
			var err error
			select {
			case err = <-closed:
			case <-time.After(30 * time.Second):
				// The admission would never end: without a bound,
				// CloseContext never returns.
				close(st.hold)
				<-closed
				t.Fatal("CloseContext still waiting 30 s after its 200 ms context ended, for an admission that never ends")
			}
			left := strings.Count(logs.String(), "stopped before their work ended")
			if timeLeft {
				if err != nil || left != 0 {
					t.Fatalf("with time left: CloseContext = %v, %d report(s) of work left; want nil, none", err, left)
				}
				if n := e.gate.registered("job:1", l.Token); n != 0 {
					t.Fatalf("CloseContext returned with %d barrier place(s) still taken", n)
				}
			} else {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("CloseContext = %v, want the context's deadline", err)
				}
				if left != 1 || !strings.Contains(logs.String(), "admissions=") {
					t.Fatalf("want one report of the admission left running, got:\n%s", logs.String())
				}
				close(st.hold) // the store admits the write now
				waitFor(t, "the late admission's place to be left", func() bool { return e.gate.registered("job:1", l.Token) == 0 })
			}
			if st.admitted.Load() != 1 {
				t.Fatalf("the store admitted %d writes, want 1", st.admitted.Load())
			}
			if n := e.up.count(); n != 0 {
				t.Fatalf("the upstream received %d request(s) admitted after the stop began, want none: %+v", n, e.up.requests())
			}
		})
	}
}

// TestLoopStopLeavesAFrozenAdmission: the Valkey store stops answering
// (a relay in front of it freezes: connections stay open, nothing comes
// back) while a write waits for its admission, the store's dial and
// command timeouts a minute. valkey-go's call on an idle connection
// honours a deadline but not a cancellation, and a mark reader opening
// waits for its deadline too, so stop's cancelling does not end them:
// CloseContext returns its context's error once that context (3 s) ends,
// not after the store's minute, and reports what it left (or, when the
// call honoured the cancellation after all, returns nil at once). When the store
// answers again, the write's place is left and the upstream never gets
// it.
func TestLoopStopLeavesAFrozenAdmission(t *testing.T) {
	srv := valkeytest.Start(t)
	relay := newCutProxy(t, srv.Addr())
	const storeTimeout = time.Minute
	st, err := valkeystore.Open(context.Background(), valkeystore.Options{URL: "valkey://" + relay.addr(),
		DialTimeout: storeTimeout, CommandTimeout: storeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var logs syncbuf.Buffer
	e := newEnvStore(t, testRules, st, nil, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	waitFor(t, "the server to start", func() bool { return e.gateSrv.srv.engine() != nil })
	l := e.acquire("job:1", "w", time.Hour)
	relay.freeze()
	sendHeldWrite(t, e, l.Token)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- e.gateSrv.srv.CloseContext(ctx) }()
	select {
	case err = <-closed:
	case <-time.After(storeTimeout / 2):
		relay.mend()
		<-closed
		t.Fatalf("CloseContext still waiting %v after its 3 s context ended, for the store's timeout (%v)", storeTimeout/2, storeTimeout)
	}
	switch n := strings.Count(logs.String(), "stopped before their work ended"); {
	case err == nil:
		// valkey-go honours a cancellation when its connection had
		// another command out (a busy machine's timing): the stop ended
		// everything in time, and has nothing to report.
		if n != 0 {
			t.Fatalf("CloseContext = nil, but %d report(s) of work left running:\n%s", n, logs.String())
		}
	case !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("CloseContext = %v, want the context's deadline (or nil: nothing left)", err)
	case n != 1:
		t.Fatalf("want one report of the work left running, got %d:\n%s", n, logs.String())
	}
	relay.mend()
	waitFor(t, "the late admission's place to be left", func() bool { return e.gate.registered("job:1", l.Token) == 0 })
	if n := e.up.count(); n != 0 {
		t.Fatalf("the upstream received %d request(s), want none", n)
	}
}

// TestLoopDrainUnderHostileClients: Shutdown with a short context while
// clients hold a head half sent (slowloris), a body stalled midway, and a
// write whose answer they never read, followed by a pipelined one. The
// drain ends with its context, CloseContext then returns without error,
// every write the upstream got arrived whole, the stalled body's write is
// not among them, and a connection after the drain began is refused (a
// write on it would not be forwarded).
func TestLoopDrainUnderHostileClients(t *testing.T) {
	e := newEnv(t, testRules)
	waitFor(t, "the server to start", func() bool { return e.gateSrv.srv.engine() != nil })
	l := e.acquire("job:1", "w", time.Hour)
	addr := e.gateSrv.Listener.Addr().String()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	write := func(body string) string {
		return fmt.Sprintf("PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: %d\r\nContent-Length: %d\r\n\r\n%s", l.Token, len(body), body)
	}
	_, _ = fmt.Fprint(dial(), "PUT /jobs/1 HTTP/1.1\r\nHost: ga")                   // slowloris
	_, _ = fmt.Fprint(dial(), write("stalled-body")[:len(write("stalled-body"))-5]) // body stalled midway
	_, _ = fmt.Fprint(dial(), write("never-read-1")+write("never-read-2"))          // pipelined, answers never read
	waitFor(t, "the pipelined writes to arrive", func() bool { return e.up.count() == 2 })

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := e.gateSrv.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want its deadline (the stalled clients hold their connections)", err)
	}
	// A connection after the drain began is refused (the listener is
	// shut); were it taken, its write must not be forwarded.
	if late, err := net.Dial("tcp", addr); err == nil {
		t.Cleanup(func() { _ = late.Close() })
		if _, err := fmt.Fprint(late, write("after-drain")); err == nil {
			_ = late.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = late.Read(make([]byte, 1))
		}
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	if err := e.gateSrv.srv.CloseContext(cctx); err != nil {
		t.Fatalf("CloseContext after the drain = %v", err)
	}
	for _, r := range e.up.requests() {
		if r.Body != "never-read-1" && r.Body != "never-read-2" {
			t.Errorf("the upstream got %q: only the two writes sent whole before the drain may arrive, whole", r.Body)
		}
	}
	if n := e.gate.InFlightResources(); n != 0 {
		t.Errorf("%d resource(s) still in flight after the close", n)
	}
}

// sendHeldWrite sends the write PUT /jobs/1 with tok to e's gate on a
// connection of its own (closed when the test ends) and returns once the
// write has taken its barrier place and waits for its admission, which
// the test's store holds back.
func sendHeldWrite(t *testing.T, e *env, tok fencing.Token) {
	t.Helper()
	c, err := net.Dial("tcp", e.gateSrv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nFencing-Token: %d\r\nContent-Length: 4\r\n\r\nlate", tok); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write to wait for its admission", func() bool { return e.gate.registered("job:1", tok) == 1 })
}
