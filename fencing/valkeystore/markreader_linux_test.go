package valkeystore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/redcon"
	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// openReader opens one of s's mark readers, which it must have.
func openReader(t *testing.T, s *Store) fencing.MarkReader {
	t.Helper()
	r, err := s.OpenMarkReader(context.Background())
	if err != nil || r == nil {
		t.Fatalf("OpenMarkReader: %v, %v", r, err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// sendMarks sends the reads of reqs on r, writing until all is sent.
func sendMarks(t *testing.T, r fencing.MarkReader, reqs []fencing.AdmitRequest) {
	t.Helper()
	pending, err := r.Send(time.Now(), reqs)
	for err == nil && pending {
		_, _ = unix.Poll([]unix.PollFd{{Fd: int32(r.Fd()), Events: unix.POLLOUT}}, 100)
		pending, err = r.Flush()
	}
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
}

// receiveMarks polls r until its batch is answered or it fails, for up to
// 5 s.
func receiveMarks(t *testing.T, r fencing.MarkReader, n int) ([]fencing.Admission, []bool, error) {
	t.Helper()
	out, settled := make([]fencing.Admission, n), make([]bool, n)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		done, err := r.Receive(out, settled)
		if err != nil || done {
			return out, settled, err
		}
		_, _ = unix.Poll([]unix.PollFd{{Fd: int32(r.Fd()), Events: unix.POLLIN}}, 100)
	}
	t.Fatal("the mark reader's batch was not answered within 5 s")
	return nil, nil, nil
}

func readMarks(t *testing.T, r fencing.MarkReader, reqs []fencing.AdmitRequest) ([]fencing.Admission, []bool) {
	t.Helper()
	sendMarks(t, r, reqs)
	out, settled, err := receiveMarks(t, r, len(reqs))
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return out, settled
}

// TestMarkReaderSettlesAtTheMark: a mark reader settles exactly the
// requests at the mark, each with Admit's answer, and leaves every other
// one (a raise, stale, not issued, unknown, invalid, needing a live lease)
// to Admit, having changed nothing.
func TestMarkReaderSettlesAtTheMark(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	ctx := context.Background()
	a := mustAcquire(t, s, "mr:a", "alice")
	mustAdmit(t, s, "mr:a", a.Token)
	old := mustAcquire(t, s, "mr:s", "alice")
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "mr:s", Owner: "alice", Token: old.Token}); err != nil {
		t.Fatal(err)
	}
	cur := mustAcquire(t, s, "mr:s", "bob")
	mustAdmit(t, s, "mr:s", cur.Token)
	raise := mustAcquire(t, s, "mr:r", "carol")

	reqs := []fencing.AdmitRequest{
		{Resource: "mr:a", Token: a.Token},                      // at the mark
		{Resource: "mr:s", Token: cur.Token},                    // at the mark
		{Resource: "mr:a", Token: a.Token},                      // again, same key
		{Resource: "mr:s", Token: old.Token},                    // stale
		{Resource: "mr:a", Token: a.Token + 1},                  // not issued
		{Resource: "mr:r", Token: raise.Token},                  // a raise
		{Resource: "mr:a", Token: a.Token, RequireLive: true},   // needs the lease
		{Resource: "mr:none", Token: 5},                         // no record
		{Resource: "", Token: 5},                                // invalid
		{Resource: "mr:s", Token: cur.Token, RequireLive: true}, // needs the lease
	}
	want := []bool{true, true, true, false, false, false, false, false, false, false}
	before := statuses(t, s, "mr:a", "mr:s", "mr:r")
	r := openReader(t, s)
	for round := range 2 { // the reader serves batch after batch
		out, settled := readMarks(t, r, reqs)
		if !reflect.DeepEqual(settled, want) {
			t.Fatalf("round %d: settled %v, want %v", round, settled, want)
		}
		if after := statuses(t, s, "mr:a", "mr:s", "mr:r"); !reflect.DeepEqual(after, before) {
			t.Fatalf("reading marks changed the records: %+v, then %+v", before, after)
		}
		for i, ok := range settled {
			if !ok {
				continue
			}
			adm, err := s.Admit(ctx, reqs[i])
			if err != nil || adm != out[i] {
				t.Fatalf("round %d: request %d settled as %+v; Admit answers %+v, %v", round, i, out[i], adm, err)
			}
		}
	}
}

// TestMarkReaderAwaiting: after a Send with a read to answer, a mark reader
// awaits its answers until Receive has them all; after a Send none of
// whose requests it can read, it awaits nothing and Receive settles the
// batch at once, settling none.
func TestMarkReaderAwaiting(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	a := mustAcquire(t, s, "aw:a", "alice")
	mustAdmit(t, s, "aw:a", a.Token)
	r := openReader(t, s)
	if r.Awaiting() {
		t.Fatal("a new reader awaits answers")
	}

	sendMarks(t, r, []fencing.AdmitRequest{{Resource: "aw:a", Token: a.Token}})
	if !r.Awaiting() {
		t.Fatal("a reader with a read out awaits nothing")
	}
	if _, settled, err := receiveMarks(t, r, 1); err != nil || !settled[0] {
		t.Fatalf("Receive: settled %v, %v", settled, err)
	}
	if r.Awaiting() {
		t.Fatal("a reader whose batch is answered still awaits answers")
	}

	unreadable := []fencing.AdmitRequest{{Resource: "", Token: 5}, {Resource: "aw:a", Token: a.Token, RequireLive: true}}
	sendMarks(t, r, unreadable)
	if r.Awaiting() {
		t.Fatal("a reader that sent no read awaits answers")
	}
	settled := []bool{true, true} // Receive sets each
	done, err := r.Receive(make([]fencing.Admission, 2), settled)
	if !done || err != nil || settled[0] || settled[1] {
		t.Fatalf("Receive of a batch with nothing to read: done %v, settled %v, %v; want done, none settled", done, settled, err)
	}
}

// statuses returns the issued and high-water tokens of each resource.
func statuses(t *testing.T, s *Store, res ...string) []string {
	t.Helper()
	var out []string
	for _, r := range res {
		st, err := s.Status(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s issued %d hw %d", r, st.Issued, st.HighWater))
	}
	return out
}

// TestMarkReaderAuthAndDatabase: a reader authenticates (password, or ACL
// user and password) and reads the URL's database, as the store's client
// does; one that cannot authenticate is not opened, and its error does not
// show the password.
func TestMarkReaderAuthAndDatabase(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.WithPassword("s3cret"))
	srv.MustDo("ACL", "SETUSER", "fg", "on", ">pa55word", "~*", "+@all")
	user := "valkey://fg:pa55word@" + srv.Addr()
	for _, url := range []string{srv.URL() + "/3", user + "/5", user} {
		t.Run(strings.ReplaceAll(url, "/", "_"), func(t *testing.T) {
			s := open(t, url, freshPrefix())
			a := mustAcquire(t, s, "mr:a", "alice")
			mustAdmit(t, s, "mr:a", a.Token)
			// Read on another database or unauthenticated, the record
			// would not be at the mark.
			if _, settled := readMarks(t, openReader(t, s), []fencing.AdmitRequest{{Resource: "mr:a", Token: a.Token}}); !settled[0] {
				t.Fatal("the reader did not settle a write at the mark")
			}
		})
	}
	s := open(t, user, freshPrefix())
	srv.MustDo("ACL", "SETUSER", "fg", "resetpass", ">n3w")
	r, err := s.OpenMarkReader(context.Background())
	if err == nil || !errors.Is(err, fencing.ErrUnavailable) || strings.Contains(err.Error(), "pa55word") {
		t.Fatalf("OpenMarkReader with a password the server no longer takes: %v, %v; want unavailable, without the password", r, err)
	}
}

// TestMarkReaderLeavesLostRecordsToAdmit: a record that is not the one the
// store last saw (here its floor moved) is not settled, even at the mark:
// Admit then finds the loss and lifts the record.
func TestMarkReaderLeavesLostRecordsToAdmit(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	s := open(t, srv.URL(), prefix)
	a := mustAcquire(t, s, "mr:a", "alice")
	mustAdmit(t, s, "mr:a", a.Token)
	r := openReader(t, s)
	req := []fencing.AdmitRequest{{Resource: "mr:a", Token: a.Token}}
	if _, settled := readMarks(t, r, req); !settled[0] {
		t.Fatal("not settled at the mark")
	}
	srv.MustDo("HSET", prefix+":{mr:a}", "floor", "1")
	if _, settled := readMarks(t, r, req); settled[0] {
		t.Fatal("a record whose floor moved was settled")
	}
	if _, err := s.Admit(context.Background(), req[0]); !errors.Is(err, fencing.ErrStoreLost) {
		t.Fatalf("Admit after the record changed: %v, want ErrStoreLost", err)
	}
}

// TestMarkReaderFaults: a reader whose server stops answering is overdue
// after the command timeout; one whose server dies fails; a closed store
// sends nothing and opens none; WaitReplicas has none.
func TestMarkReaderFaults(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix()) // CommandTimeout 2 s
	a := mustAcquire(t, s, "mr:a", "alice")
	mustAdmit(t, s, "mr:a", a.Token)
	reqs := []fencing.AdmitRequest{{Resource: "mr:a", Token: a.Token}}

	r := openReader(t, s)
	srv.Freeze()
	sendMarks(t, r, reqs)
	sent := time.Now() // not before Send's own clock reading: Overdue counts from that
	if done, err := r.Receive(make([]fencing.Admission, 1), make([]bool, 1)); done || err != nil {
		t.Fatalf("Receive from a frozen server: %v, %v", done, err)
	}
	if r.Overdue(sent) || !r.Overdue(sent.Add(2*time.Second+time.Millisecond)) {
		t.Fatal("Overdue does not follow the command timeout")
	}
	srv.Kill()
	if _, _, err := receiveMarks(t, r, 1); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Receive from a killed server: %v, want unavailable", err)
	}

	srv2 := valkeytest.Start(t)
	s2 := open(t, srv2.URL(), freshPrefix())
	r2 := openReader(t, s2)
	s2.Close()
	if _, err := r2.Send(time.Now(), reqs); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Send on a closed store: %v", err)
	}
	if r, err := s2.OpenMarkReader(context.Background()); r != nil || !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("OpenMarkReader on a closed store: %v, %v", r, err)
	}

	s3, err := Open(context.Background(), Options{URL: srv2.URL(), KeyPrefix: freshPrefix(), WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if r, err := s3.OpenMarkReader(context.Background()); r != nil || err != nil {
		t.Fatalf("OpenMarkReader with WaitReplicas: %v, %v; want none", r, err)
	}
}

// TestMarkRepliesFraming: replies split anywhere settle the same; an error
// reply or an unexpected shape is left to Admit; bytes past the batch's
// replies are a protocol error.
func TestMarkRepliesFraming(t *testing.T) {
	s := &Store{prefix: "p", seen: newSeenMarks(), slack: time.Hour}
	for _, res := range []string{"a", "c", "d", "e", "f"} {
		s.seen.observe(res, 9, 0, 2)
		s.seen.kept(res, s.now())
	}
	s.seen.observe("e", 9, 0, 0)
	reqs := []fencing.AdmitRequest{
		{Resource: "a", Token: 7},
		{Resource: "b", Token: 7, RequireLive: true}, // no read sent
		{Resource: "c", Token: 7},
		{Resource: "d", Token: 7},
		{Resource: "e", Token: 7},
		{Resource: "f", Token: 7},
	}
	replies := "*3\r\n$1\r\n9\r\n$1\r\n7\r\n$1\r\n2\r\n" + // a: issued 9, hw 7, floor 2: at the mark
		"-LOADING the server is loading\r\n" + // c
		"*2\r\n$1\r\n9\r\n$1\r\n7\r\n" + // d: two fields
		"*3\r\n$1\r\n9\r\n$1\r\n7\r\n$-1\r\n" + // e: no floor (0): at the mark
		"*3\r\n$1\r\n9\r\n:7\r\n$1\r\n2\r\n" // f: an integer, not a bulk string
	want := []bool{true, false, false, false, true, false}
	for cut := range len(replies) + 1 {
		m := markReplies{s: s}
		wire := m.start(nil, reqs)
		if got := strings.Count(string(wire), "HMGET"); got != 5 {
			t.Fatalf("%d reads sent, want 5", got)
		}
		done, err := m.add([]byte(replies[:cut]))
		if err != nil || done != (cut == len(replies)) {
			t.Fatalf("cut at %d: first part: %v, %v", cut, done, err)
		}
		if cut < len(replies) {
			if done, err = m.add([]byte(replies[cut:])); !done || err != nil {
				t.Fatalf("cut at %d: second part: %v, %v", cut, done, err)
			}
		}
		if !reflect.DeepEqual(m.ok, want) {
			t.Fatalf("cut at %d: settled %v, want %v", cut, m.ok, want)
		}
		if a := m.out[0]; a.Resource != "a" || a.Token != 7 || a.HighWater != 7 || a.Issued != 9 || a.Raised {
			t.Fatalf("settled as %+v", a)
		}
	}
	// A record whose retention no script applied within the slack is left
	// to admit.lua, which applies it.
	s.slack = 0
	m := markReplies{s: s}
	m.start(nil, reqs)
	if done, err := m.add([]byte(replies)); !done || err != nil || !reflect.DeepEqual(m.ok, make([]bool, len(reqs))) {
		t.Fatalf("with the retention due: %v, %v, settled %v; want none settled", done, err, m.ok)
	}
	s.slack = time.Hour
	m = markReplies{s: s}
	m.start(nil, reqs[:1])
	if _, err := m.add([]byte(replies[:strings.Index(replies, "-")] + "+OK\r\n")); err == nil {
		t.Fatal("a reply past the batch's was taken")
	}
}

// TestMarkReaderLeavesLostMarkRaiseToAdmit: a mark reader does not settle
// the superseded token at a mark that lost its successor's raise (see
// lostMarkRaise); Admit then finds the loss.
func TestMarkReaderLeavesLostMarkRaiseToAdmit(t *testing.T) {
	s, first, second := lostMarkRaise(t)
	req := fencing.AdmitRequest{Resource: "mark", Token: first.Token}
	if _, settled := readMarks(t, openReader(t, s), []fencing.AdmitRequest{req}); settled[0] {
		t.Fatal("the mark reader settled the superseded token at a mark that lost its raise")
	}
	_, err := s.Admit(context.Background(), req)
	wantLostMarkRaiseRefused(t, s, first, second, err)
}

// markFront plays a mark reader's server: it answers each introduction
// command (AUTH, SELECT, CLIENT SETNAME) with intro and each HMGET with
// reply. A test points a store's mark readers at it (the store's client
// stays on the real server).
type markFront struct {
	ln           net.Listener
	intro, reply atomic.Pointer[string]
	wg           sync.WaitGroup
	mu           sync.Mutex
	conns        []net.Conn
}

func newMarkFront(t *testing.T, s *Store) *markFront {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &markFront{ln: ln}
	ok := "+OK\r\n"
	f.intro.Store(&ok)
	f.reply.Store(&ok)
	s.markReaders.addr = ln.Addr().String()
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
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

func (f *markFront) serve(c net.Conn) {
	defer c.Close()
	var in []byte
	buf := make([]byte, 4096)
	for {
		k, err := c.Read(buf)
		if err != nil {
			return
		}
		in = append(in, buf[:k]...)
		var out []byte
		for {
			complete, args, _, rest, err := redcon.ReadNextCommand(in, nil)
			if err != nil || !complete {
				break
			}
			in = rest
			if strings.EqualFold(string(args[0]), "HMGET") {
				out = append(out, *f.reply.Load()...)
			} else {
				out = append(out, *f.intro.Load()...)
			}
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// TestMarkReaderRefusesMalformedServer: a server answering a mark reader's
// introduction with a malformed reply (a bulk string of 2^63-1 bytes, on
// which redcon panics; a RESP3 type) fails its opening as unavailable; one
// answering a batch's reads so fails the batch at once (the gate then
// gives it to the worker), long before the command timeout, settling
// nothing. Neither panics.
func TestMarkReaderRefusesMalformedServer(t *testing.T) {
	srv := valkeytest.Start(t)
	s, err := Open(context.Background(), Options{URL: srv.URL(), KeyPrefix: freshPrefix(), CommandTimeout: time.Minute, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	a := mustAcquire(t, s, "mr:a", "alice")
	mustAdmit(t, s, "mr:a", a.Token)
	reqs := []fencing.AdmitRequest{{Resource: "mr:a", Token: a.Token}}
	front := newMarkFront(t, s)
	for _, reply := range []string{"$9223372036854775807\r\n", "*1\r\n$9223372036854775807\r\n", "%1\r\n+a\r\n+b\r\n", "$-2\r\n"} {
		front.intro.Store(&reply)
		if r, err := s.OpenMarkReader(context.Background()); !errors.Is(err, fencing.ErrUnavailable) {
			t.Fatalf("OpenMarkReader answered %q: %v, %v; want unavailable", reply, r, err)
		}
	}
	ok := "+OK\r\n"
	front.intro.Store(&ok)
	for _, reply := range []string{
		"$9223372036854775807\r\n", "*3\r\n$9223372036854775790\r\nab", "*9223372036854775807\r\n",
		"$2000000\r\n", "*-2\r\n", ">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n", "+OK\n", "*3\r\n$1\r\n9\r\n$1\r\n7\r\n$1\r\n2\r\r",
	} {
		front.reply.Store(&reply)
		r := openReader(t, s)
		sendMarks(t, r, reqs)
		_, settled, err := receiveMarks(t, r, len(reqs)) // fails the test after 5 s
		if !errors.Is(err, fencing.ErrUnavailable) || settled[0] {
			t.Fatalf("the reply %q to HMGET: settled %v, %v; want a protocol error", reply, settled, err)
		}
	}
	// A reader of the real server settles the write.
	s.markReaders.addr = srv.Addr()
	if _, settled := readMarks(t, openReader(t, s), reqs); !settled[0] {
		t.Fatal("the reader did not settle a write at the mark")
	}
}
