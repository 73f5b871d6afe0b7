//go:build linux

package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// holdSlow makes e's upstream hold the write whose body is "slow" until
// release is closed; arrived tells when it has it.
func holdSlow(e *env) (arrived chan struct{}, release chan struct{}) {
	arrived, release = make(chan struct{}, 1), make(chan struct{})
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		if rec.Body == "slow" {
			arrived <- struct{}{}
			<-release
		}
		return false
	}
	return arrived, release
}

// shutdownBegun starts srv's Shutdown (bounded by 10 s) and returns once
// it has begun: the loops no longer accept, or, on the general engine,
// its listener is closed. Shutdown's result arrives on the channel.
func shutdownBegun(t *testing.T, srv *gateServer) <-chan error {
	t.Helper()
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- srv.srv.Shutdown(ctx)
	}()
	if e := srv.srv.engine(); e != nil {
		waitFor(t, "the shutdown to begin", e.closing.Load)
	} else {
		waitFor(t, "the listener to close", func() bool {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err == nil {
				c.Close()
			}
			return err != nil
		})
	}
	return stopped
}

// TestShutdownRelaysHTTP2AnswersInFlight: Shutdown begins while a fenced
// write over HTTP/2 is at the upstream, which answers within the
// shutdown's bound. The client gets the upstream's answer whole (the
// write was forwarded once: its answer is relayed as is), and Shutdown
// returns nil. The loops hand HTTP/2 connections to the general engine;
// closing such a connection as soon as its last stream ended cut off the
// answer's body (and a gRPC answer's trailers), so the client saw an
// error for a write the upstream had applied, and would send it again.
func TestShutdownRelaysHTTP2AnswersInFlight(t *testing.T) {
	ca := newTLSHostile(t)
	h2c := func(addr string) (*http.Client, string) { return h2client(), "http://" + addr }
	overTLS := func(addr string) (*http.Client, string) {
		tr := &http.Transport{TLSClientConfig: ca.client, Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP2(true)
		return &http.Client{Transport: tr}, "https://" + addr
	}
	for _, tc := range []struct {
		name   string
		opts   ServerOptions
		client func(addr string) (*http.Client, string)
	}{
		{"h2c, event loops", ServerOptions{H2C: true}, h2c},
		{"h2c, general engine", ServerOptions{H2C: true, NoEventLoops: true}, h2c},
		{"TLS, event loops", ServerOptions{TLS: ca.server}, overTLS},
		{"TLS, general engine", ServerOptions{TLS: ca.server, NoTLSLoops: true}, overTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules)
			arrived, release := holdSlow(e)
			srv := serveGateWith(t, e.gate, tc.opts)
			if !tc.opts.NoEventLoops && !tc.opts.NoTLSLoops {
				waitFor(t, "the event loops", func() bool { return srv.srv.engine() != nil })
			}
			c, base := tc.client(srv.Listener.Addr().String())
			c.Timeout = 10 * time.Second
			l := e.acquire("job:5", "a", time.Minute)
			got := make(chan string, 1)
			go func() {
				r, err := doReq(c, base, "PUT", "/jobs/5", "slow", HeaderToken, tok(l.Token))
				if err != nil {
					got <- "error: " + err.Error()
					return
				}
				got <- r.Body
			}()
			<-arrived
			stopped := shutdownBegun(t, srv)
			close(release)
			body, err := <-got, <-stopped
			if n := e.up.count(); n != 1 {
				t.Fatalf("the upstream got %d requests, want 1", n)
			}
			if body != "applied slow" {
				t.Errorf("the upstream applied the write; its client got %q, want %q", body, "applied slow")
			}
			if err != nil {
				t.Errorf("Shutdown = %v, want nil (the write was answered in time)", err)
			}
		})
	}
}

// TestShutdownAnswersEveryWriteItForwards: write A is at the upstream
// with write B pipelined behind it on the same connection when Shutdown
// begins. Whatever the upstream got, its client gets the answer of: B is
// either forwarded and answered, or neither (here: neither, as A's answer
// says Connection: close). With A chunked, the loops have handed the
// connection to the general engine, which went on reading B after A
// while the loops drained, forwarded it, and lost its answer when the
// connection was closed under it.
func TestShutdownAnswersEveryWriteItForwards(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"event loops", "Content-Length: 4\r\n\r\nslow"},
		{"handed to the general engine (chunked)", "Transfer-Encoding: chunked\r\n\r\n4\r\nslow\r\n0\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules)
			arrived, release := holdSlow(e)
			waitFor(t, "the event loops", func() bool { return e.gateSrv.srv.engine() != nil })
			a := e.acquire("job:5", "a", time.Minute)
			b := e.acquire("job:6", "a", time.Minute)
			c, err := net.Dial("tcp", e.gateSrv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "PUT /jobs/5 HTTP/1.1\r\nHost: x\r\nFencing-Token: "+tok(a.Token)+"\r\n"+tc.body+
				"PUT /jobs/6 HTTP/1.1\r\nHost: x\r\nFencing-Token: "+tok(b.Token)+"\r\nContent-Length: 1\r\n\r\nb"); err != nil {
				t.Fatal(err)
			}
			<-arrived
			stopped := shutdownBegun(t, e.gateSrv)
			close(release)
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			answers, _ := io.ReadAll(c) // until the gate closes the connection
			if err := <-stopped; err != nil {
				t.Errorf("Shutdown = %v, want nil", err)
			}
			n := strings.Count(string(answers), "HTTP/1.1 ")
			if got := e.up.count(); n != got {
				t.Errorf("the upstream got %d writes, their client %d answers: %q", got, n, answers)
			}
			if !strings.Contains(string(answers), "\r\nConnection: close\r\n") {
				t.Errorf("the answer given while stopping does not say Connection: close: %q", answers)
			}
		})
	}
}

// TestShutdownRefusesNewConnections: once Shutdown has begun, a new
// connection is refused at once, as by a closed listener, on every engine:
// not queued unanswered by the kernel until the drain ends (a client's
// write would wait the whole grace, then find its connection reset),
// while the write in flight is still answered.
func TestShutdownRefusesNewConnections(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts ServerOptions
	}{{"event loops", ServerOptions{}}, {"general engine", ServerOptions{NoEventLoops: true}}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testRules)
			arrived, release := holdSlow(e)
			srv := serveGateWith(t, e.gate, tc.opts)
			if !tc.opts.NoEventLoops {
				waitFor(t, "the event loops", func() bool { return srv.srv.engine() != nil })
			}
			l := e.acquire("job:5", "a", time.Minute)
			got := make(chan response, 1)
			go func() {
				r, _ := doReq(srv.Client(), srv.URL, "PUT", "/jobs/5", "slow", HeaderToken, tok(l.Token))
				got <- r
			}()
			<-arrived
			stopped := shutdownBegun(t, srv)
			waitFor(t, "new connections to be refused", func() bool {
				c, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err == nil {
					c.Close()
				}
				return err != nil
			})
			close(release)
			if r := <-got; r.Body != "applied slow" {
				t.Errorf("the write in flight got %d %q, want the upstream's answer", r.Status, r.Body)
			}
			if err := <-stopped; err != nil {
				t.Errorf("Shutdown = %v, want nil", err)
			}
		})
	}
}

// partialHeads counts the loops' client connections holding part of a
// request head (not idle: the drain leaves them open).
func partialHeads(e *loopEngine) int {
	n := 0
	for _, l := range e.loops {
		l.call(func() {
			for c := range l.clients {
				if c.state == stHead && len(c.In) > 0 {
					n++
				}
			}
		})
	}
	return n
}

// TestShutdownAnswersHeadsArrivingAsItBegins: two writes' heads are
// arriving on the loops' connections when Shutdown begins. Their heads
// end after the general engine has stopped taking connections: one with a
// Content-Length body (the loops serve it: forwarded, answered), one
// chunked (the loops would hand it over: they answer it 503 draining
// themselves, and it is not forwarded). Neither client is left with a
// connection closed without an answer.
func TestShutdownAnswersHeadsArrivingAsItBegins(t *testing.T) {
	e := newEnv(t, testRules)
	waitFor(t, "the event loops", func() bool { return e.gateSrv.srv.engine() != nil })
	a := e.acquire("job:5", "a", time.Minute)
	b := e.acquire("job:6", "a", time.Minute)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", e.gateSrv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	plain, chunked := dial(), dial()
	for _, c := range []net.Conn{plain, chunked} {
		if _, err := io.WriteString(c, "PUT /jobs/"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both heads to be partly read", func() bool { return partialHeads(e.gateSrv.srv.engine()) == 2 })
	stopped := shutdownBegun(t, e.gateSrv)
	waitFor(t, "the general engine to stop taking connections", func() bool {
		select {
		case <-e.gateSrv.srv.handoff.done:
			return true
		default:
			return false
		}
	})
	if _, err := io.WriteString(plain, "5 HTTP/1.1\r\nHost: x\r\nFencing-Token: "+tok(a.Token)+"\r\nContent-Length: 5\r\n\r\nplain"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(chunked, "6 HTTP/1.1\r\nHost: x\r\nFencing-Token: "+tok(b.Token)+"\r\nTransfer-Encoding: chunked\r\n\r\n7\r\nchunked\r\n0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, body, want string
		c                net.Conn
	}{
		{"Content-Length (the loops serve it)", "plain", "HTTP/1.1 200 ", plain},
		{"chunked (would be handed over)", "chunked", "HTTP/1.1 503 ", chunked},
	} {
		_ = tc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, _ := io.ReadAll(tc.c)
		forwarded := 0
		for _, r := range e.up.requests() {
			if r.Body == tc.body {
				forwarded++
			}
		}
		switch {
		case !strings.HasPrefix(string(got), tc.want):
			t.Errorf("%s: answered %q, want %q...", tc.name, got, tc.want)
		case tc.want == "HTTP/1.1 200 " && forwarded != 1, tc.want == "HTTP/1.1 503 " && (forwarded != 0 || !strings.Contains(string(got), `"draining"`)):
			t.Errorf("%s: forwarded %d times, answered %q", tc.name, forwarded, got)
		}
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown = %v, want nil", err)
	}
}
