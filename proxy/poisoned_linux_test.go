//go:build linux

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// poisonUpstream is a hostile upstream on loopback: it answers each
// request with the request's body (a marker), and after every third
// answer poisons the connection: it sends a complete forged response no
// request asked for (on even connections) or half-closes it, going on
// reading (on odd ones). It records every request it receives, and those
// that came on a connection it had poisoned. answered(m) is closed once
// the answer to marker m and any poison after it have been acknowledged
// by the gate's kernel (the socket's send queue is empty): from then on
// the gate can know the connection is spoilt.
type poisonUpstream struct {
	ln net.Listener

	mu          sync.Mutex
	received    int
	afterPoison []string // markers of requests received on a poisoned connection
	done        map[string]chan struct{}
}

func newPoisonUpstream(t *testing.T) *poisonUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &poisonUpstream{ln: ln, done: map[string]chan struct{}{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(t, c.(*net.TCPConn), n) })
		}
	})
	return p
}

// answered is closed once m's answer (and any poison after it) reached
// the gate's kernel.
func (p *poisonUpstream) answered(m string) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := p.done[m]
	if ch == nil {
		ch = make(chan struct{})
		p.done[m] = ch
	}
	return ch
}

func (p *poisonUpstream) serve(t *testing.T, c *net.TCPConn, n int) {
	defer c.Close()
	br := bufio.NewReader(c)
	poisoned := false
	for i := 0; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		m := string(body)
		p.mu.Lock()
		p.received++
		if poisoned {
			p.afterPoison = append(p.afterPoison, fmt.Sprintf("%s (connection %d, %s, its request %d)", m, n, map[bool]string{true: "forged bytes", false: "half-closed"}[n%2 == 0], i))
		}
		p.mu.Unlock()
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(m), m); err != nil {
			return
		}
		if !poisoned && i%3 == 2 {
			poisoned = true
			if n%2 == 0 {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
			} else {
				_ = c.CloseWrite()
			}
		}
		waitAcked(t, c)
		close(p.answered(m))
	}
}

// waitAcked waits until the peer's kernel acknowledged everything c sent
// (its FIN too): its send queue is empty.
func waitAcked(t *testing.T, c *net.TCPConn) {
	raw, err := c.SyscallConn()
	if err != nil {
		t.Error(err)
		return
	}
	for {
		var queued int
		var ierr error
		if err := raw.Control(func(fd uintptr) { queued, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || ierr != nil {
			t.Error(err, ierr)
			return
		}
		if queued == 0 {
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// TestPoisonedUpstreamConnectionsAreNotReused: on the event loops, an
// idle upstream connection on which the upstream sent bytes no request
// asked for, or which it half-closed (while still reading), is never given
// to a later fenced write, however recently it was used (the loops take
// the connection used last): the client gets every write's own answer, and
// the upstream's own record shows no write arriving on a connection after
// it spoilt it. One client sends the writes in turn, each only once the
// bytes or FIN spoiling the connection before it have reached the gate's
// kernel: bytes that cross a request on the wire cannot be told from its
// answer by any HTTP/1.1 client. (The general engine is net/http's
// Transport, whose reading goroutine may not have seen a FIN yet when the
// next request takes the connection: that write is sent on it and
// answered 502, "may have been applied".)
func TestPoisonedUpstreamConnectionsAreNotReused(t *testing.T) {
	up := newPoisonUpstream(t)
	u, _ := url.Parse("http://" + up.ln.Addr().String())
	st := memstore.New(memstore.Options{})
	rules, _ := ParseRules(testRules)
	g, err := New(Options{Upstream: u, Store: st, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	gs := serveGate(t, g)
	const resources, writes = 3, 150
	var tokens [resources]fencing.Token
	for k := range tokens {
		l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: fmt.Sprintf("job:%d", k), Owner: "o", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		tokens[k] = l.Token
	}
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	for i := range writes {
		k := i % resources
		m := fmt.Sprintf("m-%d", i)
		req, _ := http.NewRequest(http.MethodPut, gs.URL+"/jobs/"+fmt.Sprint(k), strings.NewReader(m))
		req.Header.Set("Fencing-Token", tokens[k].String())
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != m {
			t.Errorf("write %s answered %d %q, want 200 and its own answer", m, resp.StatusCode, b)
			break
		}
		<-up.answered(m)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.afterPoison) > 0 {
		t.Errorf("the upstream received %d writes, %d on connections it had spoilt: %v", up.received, len(up.afterPoison), up.afterPoison)
	}
}
