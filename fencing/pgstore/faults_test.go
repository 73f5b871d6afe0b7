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
	// cut is set once a reply was lost: from then on the proxy passes no
	// cancel request, as a network that lost the reply would not either.
	// Otherwise the client, giving up, cancels the statement the server
	// may still be running, and what the server commits becomes a race.
	cut atomic.Bool
	// lostDone is closed once the server has ended a connection whose
	// reply was lost: it has then processed every message it got on it,
	// the COMMIT included (see lostReplyProcessed).
	lostDone     chan struct{}
	lostDoneOnce sync.Once
	wg           sync.WaitGroup
	mu           sync.Mutex
	conns        []net.Conn
}

// cancelRequestCode opens a CancelRequest, in place of a startup
// message's protocol version.
const cancelRequestCode = 80877102

func newFaultProxy(t testing.TB, target string) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{t: t, ln: ln, target: target, lostDone: make(chan struct{})}
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
		mute := new(atomic.Bool) // set before the message whose reply is lost goes on
		go func() { defer p.wg.Done(); p.fromServer(server, client, mute) }()
		go func() { defer p.wg.Done(); p.fromClient(client, server, mute) }()
	}
}

// fromServer relays the server's replies until the server ends the
// connection. Once mute is set or the client is gone (a reply being
// lost), it goes on reading the server's replies and drops them: the
// server's socket is never closed with replies unread, which would reset
// the connection and could discard what the server had not yet read of
// the client's last messages.
func (p *faultProxy) fromServer(server, client net.Conn, mute *atomic.Bool) {
	defer server.Close()
	buf := make([]byte, 32<<10)
	clientGone := false
	for {
		n, err := server.Read(buf)
		clientGone = clientGone || mute.Load()
		if n > 0 && !p.stall.Load() && !clientGone {
			if _, werr := client.Write(buf[:n]); werr != nil {
				clientGone = true
			}
		}
		if err != nil {
			client.Close()
			if mute.Load() {
				p.lostDoneOnce.Do(func() { close(p.lostDone) })
			}
			return
		}
	}
}

// lostReplyProcessed waits until the server has ended the connection on
// which a reply was lost. The client gives up as soon as its connection is
// cut, often before the server has read the message whose reply is lost;
// the server ends the connection only after it has run every message it
// received (the proxy closed its side for writing after that message), so
// what that message committed is visible from here on. It fails the test
// after 30 s, far above any commit's time.
func (p *faultProxy) lostReplyProcessed() {
	p.t.Helper()
	select {
	case <-p.lostDone:
	case <-time.After(30 * time.Second):
		p.t.Fatal("the server did not end the connection whose reply was lost within 30 s")
	}
}

// fromClient relays the client's messages one by one: the startup message
// (no type byte), then typed messages. When a COMMIT goes by while dropNext
// is armed, or a Sync after an Execute (the end of statements sent together,
// which commit together) while dropSync is, it is delivered and the
// client's connection is cut: no byte of the reply reaches it (mute is
// set before the message goes on), and the proxy passes no cancel request
// from then on (see cut). The server's
// side is then only closed for writing: the server reads every message up
// to that end (so the COMMIT or Sync is processed, however slow the
// server), answers into fromServer, which drops the answer, and ends the
// connection itself.
func (p *faultProxy) fromClient(client, server net.Conn, mute *atomic.Bool) {
	closeServer := true
	defer func() {
		if closeServer {
			server.Close()
		}
	}()
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
		if first && len(body) == 12 && binary.BigEndian.Uint32(body) == cancelRequestCode && p.cut.Load() {
			return // a cancel request, lost
		}
		// (the store's reads name synchronous_commit: not a COMMIT)
		isCommit := !first && (head[0] == 'Q' || head[0] == 'P') &&
			bytes.Contains(bytes.ReplaceAll(bytes.ToLower(body), []byte("synchronous_commit"), nil), []byte("commit"))
		isSync := !first && head[0] == 'S' && executed
		if !first {
			executed = head[0] == 'E' || executed && head[0] != 'S'
		}
		first = false
		if p.stall.Load() {
			continue
		}
		// Decided before the message goes on: decided after, a statement
		// that completed before the drop was armed (the server answered
		// as soon as it had the message) could take the drop meant for
		// the next one, and the next one would then fail on a connection
		// cut before it, having reached no server.
		drop := isCommit && p.dropNext.CompareAndSwap(true, false) || isSync && p.dropSync.CompareAndSwap(true, false)
		if drop {
			mute.Store(true) // no byte of the reply may reach the client
		}
		if _, err := server.Write(append(head, body...)); err != nil {
			return
		}
		if drop {
			p.cut.Store(true)
			client.Close() // the reply is lost; the server still commits
			if tc, ok := server.(*net.TCPConn); ok && tc.CloseWrite() == nil {
				closeServer = false // fromServer closes it once the server has ended
			}
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
	p.lostReplyProcessed()
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
