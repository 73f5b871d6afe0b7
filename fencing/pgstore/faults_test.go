package pgstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// faultProxy sits between a store and the server and can lose the reply
// to a COMMIT (the server commits, the client hears nothing) or stall
// every connection.
type faultProxy struct {
	t        testing.TB
	ln       net.Listener
	target   string
	dropNext atomic.Bool // lose the reply to the next COMMIT
	dropSync atomic.Bool // lose the reply to the next statements run on a Sync (one implicit transaction)
	stall    atomic.Bool // relay nothing from now on
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newFaultProxy(t testing.TB, target string) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{t: t, ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *faultProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.track(client)
		p.track(server)
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.fromServer(server, client) }()
		go func() { defer p.wg.Done(); p.fromClient(client, server) }()
	}
}

func (p *faultProxy) fromServer(server, client net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 && !p.stall.Load() {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			client.Close()
			return
		}
	}
}

// fromClient relays the client's messages one by one: the startup message
// (no type byte), then typed messages. When a COMMIT goes by while dropNext
// is armed, or a Sync after an Execute (the end of statements sent together,
// which commit together) while dropSync is, it is delivered and the
// client's connection is cut before the reply can reach it.
func (p *faultProxy) fromClient(client, server net.Conn) {
	defer server.Close()
	first, executed := true, false
	for {
		var head []byte
		if first {
			head = make([]byte, 4)
		} else {
			head = make([]byte, 5)
		}
		if _, err := io.ReadFull(client, head); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[len(head)-4:])) - 4
		body := make([]byte, n)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		isCommit := !first && (head[0] == 'Q' || head[0] == 'P') && bytes.Contains(bytes.ToLower(body), []byte("commit"))
		isSync := !first && head[0] == 'S' && executed
		if !first {
			executed = head[0] == 'E' || executed && head[0] != 'S'
		}
		first = false
		if p.stall.Load() {
			continue
		}
		if _, err := server.Write(append(head, body...)); err != nil {
			return
		}
		if isCommit && p.dropNext.CompareAndSwap(true, false) || isSync && p.dropSync.CompareAndSwap(true, false) {
			client.Close() // the reply is lost; the server still commits
			time.Sleep(200 * time.Millisecond)
			return
		}
	}
}

func openVia(t testing.TB, addr, schema string, timeout time.Duration) *Store {
	t.Helper()
	c := pgtest.Need(t, cluster)
	url := strings.Replace(c.URL("postgres"), "127.0.0.1:"+strconv.Itoa(c.Port()), addr, 1)
	s, err := Open(context.Background(), Options{URL: url, Schema: schema, StatementTimeout: timeout})
	if err != nil {
		t.Fatalf("Open via proxy: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestLostCommitReplyIsAmbiguous: the server commits a token but its reply
// never arrives: the store says ErrAmbiguous (not ErrUnavailable, which
// would promise nothing happened), and the token was indeed issued.
func TestLostCommitReplyIsAmbiguous(t *testing.T) {
	c := pgtest.Need(t, cluster)
	schema := freshSchema()
	p := newFaultProxy(t, "127.0.0.1:"+strconv.Itoa(c.Port()))
	s := openVia(t, p.addr(), schema, 5*time.Second)
	ctx := context.Background()
	p.dropNext.Store(true)
	_, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "amb", Owner: "a", TTL: time.Minute})
	if !errors.Is(err, fencing.ErrAmbiguous) || errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Acquire with its COMMIT reply lost: %v, want ErrAmbiguous", err)
	}
	direct := open(t, schema)
	st, err := direct.Status(ctx, "amb")
	if err != nil || st.Issued == 0 || st.Lease == nil || st.Lease.Token != st.Issued {
		t.Fatalf("after the lost reply: %+v %v, want the acquisition committed", st, err)
	}
	// The store recovers on a new connection.
	if l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "amb", Owner: "a", TTL: time.Minute}); err != nil || l.Token != st.Issued {
		t.Fatalf("Acquire after the fault: %+v %v", l, err)
	}
}

// TestStalledServerFailsClosed: a server that stops answering makes every
// operation fail within the statement timeout, as a store fault: a read
// or an uncommitted write is unavailable (nothing changed).
func TestStalledServerFailsClosed(t *testing.T) {
	c := pgtest.Need(t, cluster)
	p := newFaultProxy(t, "127.0.0.1:"+strconv.Itoa(c.Port()))
	s := openVia(t, p.addr(), freshSchema(), 300*time.Millisecond)
	defer p.close() // before the store closes: pgx waits for a stalled server's goodbye
	ctx := context.Background()
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "stall", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p.stall.Store(true)
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "stall", Token: l.Token}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Admit on a stalled server: %v, want ErrUnavailable", err)
	}
	if _, err := s.Renew(ctx, fencing.RenewRequest{Resource: "stall", Owner: "a", Token: l.Token}); !fencing.IsStoreFault(err) {
		t.Fatalf("Renew on a stalled server: %v, want a store fault", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Ping on a stalled server: %v", err)
	}
}

// TestRefusedConnectionIsUnavailable: with nothing listening, every
// operation is ErrUnavailable.
func TestRefusedConnectionIsUnavailable(t *testing.T) {
	c := pgtest.Need(t, cluster)
	p := newFaultProxy(t, "127.0.0.1:"+strconv.Itoa(c.Port()))
	s := openVia(t, p.addr(), freshSchema(), 2*time.Second)
	p.close() // closes the listener and every pooled connection
	ctx := context.Background()
	for name, err := range map[string]error{
		"acquire": func() error {
			_, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Minute})
			return err
		}(),
		"admit": func() error { _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: 1}); return err }(),
		"list":  func() error { _, err := s.List(ctx, fencing.ListRequest{}); return err }(),
		"ping":  s.Ping(ctx),
	} {
		if !errors.Is(err, fencing.ErrUnavailable) {
			t.Errorf("%s with the server unreachable: %v, want ErrUnavailable", name, err)
		}
	}
}

// TestLockWaitIsBounded: a row locked by a stuck transaction makes a write
// fail after the statement timeout, unavailable, instead of hanging.
func TestLockWaitIsBounded(t *testing.T) {
	schema := freshSchema()
	s := open(t, schema)
	ctx := context.Background()
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "locked", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+schema+`.resources WHERE resource = 'locked' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	short := open(t, schema)
	short.timeout = 300 * time.Millisecond
	if _, err := short.Acquire(ctx, fencing.AcquireRequest{Resource: "locked", Owner: "a", TTL: time.Minute}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Acquire behind a held row lock: %v, want ErrUnavailable", err)
	}
}
