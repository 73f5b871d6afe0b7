package leaseapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/leaseapi"
	"github.com/fencegate/fencegate/proxy"
)

// sessionEnv is the real lease API over a memory store on loopback, with a
// fake clock shared by the store and the sessions, and a switch to make the
// API stop answering (hang) or fail renewals with 503.
type sessionEnv struct {
	clock  *fakeClock
	store  fencing.Store
	srv    *httptest.Server
	client *leaseapi.Client
	start  time.Time

	hang      atomic.Bool  // every call blocks until its client gives up
	hung      atomic.Int64 // calls that reached the server while it hangs
	abandoned atomic.Int64 // hung calls whose client gave up (cancelled the request)
	fail503   atomic.Bool  // renewals answer 503 store-unavailable
	slowRenew atomic.Int64 // the fake clock moves this far while a renewal is served
	// beforeCheckpoint, when set, runs before a checkpoint is served.
	beforeCheckpoint func()
	// acquireTTL, when set, replaces ttl_seconds in the API's answers to
	// acquisitions: a server (or a proxy) that claims another TTL than
	// asked for, while its store holds the lease as asked.
	acquireTTL atomic.Int64
	mu         sync.Mutex
	calls      map[string]int // "POST acquire" -> count of calls served
	afterAcq   func(n int)    // run after the n-th acquire was served
	unhang     chan struct{}  // closed at cleanup, releasing hung calls
	// lie, when set, answers renewals in the API's place: a server (or a
	// proxy) that answers something else than the session's lease.
	lie atomic.Pointer[func(w http.ResponseWriter, r *http.Request)]
}

func newSessionEnv(t *testing.T) *sessionEnv {
	t.Helper()
	e := &sessionEnv{clock: newClock(), calls: map[string]int{}, unhang: make(chan struct{})}
	e.start = e.clock.Now()
	e.store = memstore.New(memstore.Options{Clock: e.clock})
	api := leaseapi.NewServer(leaseapi.Options{Store: e.store})
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := r.Method + " " + r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
		if e.hang.Load() {
			// The server notices a client going away only once it has
			// read the request body.
			_, _ = io.Copy(io.Discard, r.Body)
			e.hung.Add(1)
			select {
			case <-r.Context().Done():
				e.abandoned.Add(1)
			case <-e.unhang:
			}
			return
		}
		if lie := e.lie.Load(); lie != nil && strings.HasSuffix(r.URL.Path, "/renew") {
			(*lie)(w, r)
			e.count(op)
			return
		}
		if e.fail503.Load() && strings.HasSuffix(r.URL.Path, "/renew") {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"type":"urn:fencegate:problem:store-unavailable","title":"Service Unavailable","status":503,"detail":"x","code":"store-unavailable"}`)
			e.count(op)
			return
		}
		if d := time.Duration(e.slowRenew.Load()); d > 0 && op == "POST renew" {
			e.clock.Advance(d)
		}
		if op == "PUT checkpoint" && e.beforeCheckpoint != nil {
			e.beforeCheckpoint()
		}
		if ttl := e.acquireTTL.Load(); ttl != 0 && op == "POST acquire" {
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, r)
			var l map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &l); err == nil && rec.Code == http.StatusOK {
				l["ttl_seconds"] = ttl
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(rec.Code)
			_ = json.NewEncoder(w).Encode(l)
		} else {
			api.ServeHTTP(w, r)
		}
		n := e.count(op)
		if op == "POST acquire" && e.afterAcq != nil {
			e.afterAcq(n)
		}
	}))
	t.Cleanup(func() {
		close(e.unhang)
		e.srv.Close()
		_ = e.store.Close()
	})
	e.client = leaseapi.NewClient(e.srv.URL)
	return e
}

func (e *sessionEnv) count(op string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls[op]++
	return e.calls[op]
}

func (e *sessionEnv) served(op string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[op]
}

// at is a time relative to the start of the test.
func (e *sessionEnv) at(d time.Duration) time.Time { return e.start.Add(d) }

func (e *sessionEnv) session(t *testing.T, owner string) *leaseapi.Session {
	t.Helper()
	s, err := leaseapi.NewSession(context.Background(), e.client, "job:1", leaseapi.SessionOptions{Owner: owner, TTL: 30 * time.Second, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.hang.Store(false)
		_, _ = s.Release(context.Background(), false)
	})
	return s
}

func (e *sessionEnv) status(t *testing.T) fencing.Status {
	t.Helper()
	st, err := e.store.Status(context.Background(), "job:1")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitDone waits for the session to end; the real-time bound only keeps a
// broken test from hanging.
func waitDone(t *testing.T, s *leaseapi.Session) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not end")
	}
}

// With TTL 30 s and the default margin (3 s), a session acquired at t=0
// renews at 10 s, 20 s, ..., each renewal counted from its own send time.
func TestSessionRenewsEveryThirdOfTTL(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	if s.Token() != 1 || s.Owner() != "w1" || s.Resource() != "job:1" || s.Err() != nil {
		t.Fatalf("new session: token %d owner %q resource %q err %v", s.Token(), s.Owner(), s.Resource(), s.Err())
	}
	for i := 1; i <= 3; i++ {
		e.clock.waitTimer(t, e.at(time.Duration(i)*10*time.Second))
		if got := e.served("POST renew"); got != i-1 {
			t.Fatalf("before renewal %d: %d renewals served", i, got)
		}
		e.clock.Advance(10 * time.Second)
		e.clock.waitTimer(t, e.at(time.Duration(i+1)*10*time.Second)) // the renewal is done
		if got := e.served("POST renew"); got != i {
			t.Fatalf("after renewal %d: %d renewals served", i, got)
		}
		if st := e.status(t); st.Lease == nil || !st.Lease.ExpiresAt.Equal(e.at(time.Duration(i)*10*time.Second+30*time.Second)) {
			t.Fatalf("after renewal %d the store has %+v", i, st.Lease)
		}
	}
	select {
	case <-s.Done():
		t.Fatalf("session ended: %v", s.Err())
	default:
	}
}

// A renewal answered 503 is retried after RetryInterval (TTL/15 = 2 s),
// and the session lives on when the retry succeeds.
func TestSessionRetriesFailedRenewals(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	e.fail503.Store(true)
	e.clock.waitTimer(t, e.at(10*time.Second))
	e.clock.Advance(10 * time.Second)
	e.clock.waitTimer(t, e.at(12*time.Second))
	e.clock.Advance(2 * time.Second)
	e.clock.waitTimer(t, e.at(14*time.Second))
	if got := e.served("POST renew"); got != 2 {
		t.Fatalf("%d failed renewals served, want 2", got)
	}
	e.fail503.Store(false)
	e.clock.Advance(2 * time.Second)
	e.clock.waitTimer(t, e.at(24*time.Second)) // next renewal: 10 s after the successful one
	if s.Err() != nil || e.served("POST renew") != 3 {
		t.Fatalf("after a successful retry: err %v, %d renewals", s.Err(), e.served("POST renew"))
	}
}

// A renewal answered with a 4xx that is not the lease API's (a proxy's 404
// page) says nothing of the lease: retried as a 503 is, and the session
// lives on when the retry is confirmed. It used to end the session at once.
func TestSessionRetriesAnAnswerNotFromTheAPI(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	notFound := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, "<html>no route</html>")
	}
	e.lie.Store(&notFound)
	e.clock.waitTimer(t, e.at(10*time.Second))
	e.clock.Advance(10 * time.Second)
	e.clock.waitTimer(t, e.at(12*time.Second)) // the retry, RetryInterval later
	if err := s.Err(); err != nil || e.served("POST renew") != 1 {
		t.Fatalf("after a proxy's 404: err %v, %d renewals; want the session live, the renewal retried", err, e.served("POST renew"))
	}
	e.lie.Store(nil)
	e.clock.Advance(2 * time.Second)
	e.clock.waitTimer(t, e.at(22*time.Second)) // next renewal: 10 s after the confirmed retry
	if s.Err() != nil || e.served("POST renew") != 2 {
		t.Fatalf("after the retry: err %v, %d renewals", s.Err(), e.served("POST renew"))
	}
}

// A refused renewal (the lease was released behind the session's back)
// ends the session at once.
func TestSessionLostOnRefusedRenewal(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	if ok, err := e.client.Release(context.Background(), "job:1", "w1", s.Token(), false); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := e.client.Acquire(context.Background(), "job:1", leaseapi.AcquireOptions{Owner: "w2"}); err != nil {
		t.Fatal(err)
	}
	e.clock.waitTimer(t, e.at(10*time.Second))
	e.clock.Advance(10 * time.Second)
	waitDone(t, s)
	err := s.Err()
	if !errors.Is(err, leaseapi.ErrSessionLost) || !errors.Is(err, fencing.ErrLeaseLost) || errors.Is(err, leaseapi.ErrRenewDeadline) {
		t.Fatalf("Err = %v, want a refused renewal", err)
	}
}

// When the API stops answering, the session gives up at its local
// deadline (send time of the last confirmed call + TTL - margin = 27 s),
// while the server still counts the lease as live until 30 s.
func TestSessionLostAtLocalDeadline(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	e.hang.Store(true)
	e.clock.waitTimer(t, e.at(10*time.Second))
	e.clock.Advance(10 * time.Second)
	e.clock.waitTimer(t, e.at(27*time.Second)) // the renewal is in flight, bounded by the deadline
	eventually(t, "the renewal reached the server", func() bool { return e.hung.Load() == 1 })
	e.clock.Advance(16*time.Second + 999*time.Millisecond)
	if s.Err() != nil {
		t.Fatalf("lost before the deadline: %v", s.Err())
	}
	e.clock.Advance(time.Millisecond)
	waitDone(t, s)
	err := s.Err()
	if !errors.Is(err, leaseapi.ErrSessionLost) || !errors.Is(err, leaseapi.ErrRenewDeadline) {
		t.Fatalf("Err = %v, want the local deadline", err)
	}
	if st := e.status(t); st.Lease == nil || st.Lease.Owner != "w1" {
		t.Fatalf("the server no longer holds the lease when the session gives up: %+v", st.Lease)
	}
	// The renewal still out at the deadline was abandoned: its request is
	// cancelled, not left hanging on the connection.
	eventually(t, "the renewal abandoned at the deadline was cancelled", func() bool { return e.abandoned.Load() == 1 })
}

// eventually waits until cond holds: for what another goroutine does in
// real time (an HTTP exchange). The bound only keeps a broken test from
// hanging.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for giveUp := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(giveUp) {
			t.Fatalf("not so after 20 s: %s", what)
		}
	}
}

// A renewal's deadline, and the next renewal, count from when its request
// was sent, not from when its answer came: the server started the TTL
// somewhere in between.
func TestSessionDeadlineCountsFromTheRenewalsSendTime(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	e.clock.waitTimer(t, e.at(10*time.Second))
	e.slowRenew.Store(int64(2 * time.Second)) // sent at 10 s, answered at 12 s
	e.clock.Advance(10 * time.Second)
	e.clock.waitTimer(t, e.at(20*time.Second)) // 10 s after the send, not the answer
	if st := e.status(t); st.Lease == nil || !st.Lease.ExpiresAt.Equal(e.at(42*time.Second)) {
		t.Fatalf("the server's lease after the slow renewal: %+v", st.Lease)
	}
	e.slowRenew.Store(0)
	e.hang.Store(true)
	e.clock.Advance(8 * time.Second)
	e.clock.waitTimer(t, e.at(37*time.Second)) // 10 s + 30 s - 3 s, not 39 s
	e.clock.Advance(17*time.Second - time.Millisecond)
	if s.Err() != nil {
		t.Fatalf("lost before the deadline: %v", s.Err())
	}
	e.clock.Advance(time.Millisecond)
	waitDone(t, s)
	if err := s.Err(); !errors.Is(err, leaseapi.ErrRenewDeadline) {
		t.Fatalf("Err = %v, want the local deadline", err)
	}
}

// Renewals that keep failing are retried every RetryInterval, each failure
// reported to OnRetry, until the local deadline ends the session; the loss
// names the last failure.
func TestSessionRetriesUntilTheDeadline(t *testing.T) {
	e := newSessionEnv(t)
	var mu sync.Mutex
	var retried []error
	s, err := leaseapi.NewSession(context.Background(), e.client, "job:1", leaseapi.SessionOptions{
		Owner: "w1", TTL: 30 * time.Second, RetryInterval: 3 * time.Second, Clock: e.clock,
		OnRetry: func(err error) {
			mu.Lock()
			retried = append(retried, err)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.Release(context.Background(), false) })
	e.fail503.Store(true)
	e.clock.waitTimer(t, e.at(10*time.Second))
	e.clock.Advance(10 * time.Second)
	// Retried at 13, 16, ..., 25 s; the retry due at 28 s is past the
	// deadline (27 s), so the session wakes at the deadline and gives up.
	for at := 13 * time.Second; at <= 25*time.Second; at += 3 * time.Second {
		e.clock.waitTimer(t, e.at(at))
		e.clock.Advance(3 * time.Second)
	}
	// The sixth failure must be in before the clock moves: until then the
	// pending timer at 27 s may be the deadline of the renewal in flight.
	eventually(t, "six failures reported to OnRetry", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(retried) == 6
	})
	e.clock.waitTimer(t, e.at(27*time.Second))
	if s.Err() != nil {
		t.Fatalf("lost before the deadline: %v", s.Err())
	}
	e.clock.Advance(2 * time.Second)
	waitDone(t, s)
	err = s.Err()
	var pe *leaseapi.ProblemError
	if !errors.Is(err, leaseapi.ErrSessionLost) || !errors.Is(err, leaseapi.ErrRenewDeadline) || !errors.As(err, &pe) || pe.Status != 503 {
		t.Fatalf("Err = %v, want lost at the deadline, naming the last 503", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := e.served("POST renew"); n != 6 || len(retried) != 6 {
		t.Fatalf("%d renewals served, %d reported to OnRetry; want 6 and 6", n, len(retried))
	}
	for _, r := range retried {
		if !errors.As(r, &pe) || pe.Status != 503 {
			t.Fatalf("OnRetry got %v", r)
		}
	}
}

// Err checks the deadline itself: after a pause past it (the clock jumps),
// the session reports the loss at once, before its goroutine runs.
func TestSessionErrChecksTheDeadline(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	e.hang.Store(true)
	e.clock.Advance(27 * time.Second)
	if err := s.Err(); !errors.Is(err, leaseapi.ErrRenewDeadline) {
		t.Fatalf("Err right after the jump = %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed although Err reported the loss")
	}
}

// A checkpoint saves the state and counts as a renewal: the deadline moves
// to its send time + TTL - margin. After the session ends, Checkpoint sends
// nothing.
func TestSessionCheckpoint(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	e.clock.Advance(5 * time.Second)
	l, err := s.Checkpoint(context.Background(), map[string]int{"done": 7})
	if err != nil || l.Token != s.Token() {
		t.Fatal(l, err)
	}
	cp, err := e.client.ReadCheckpoint(context.Background(), "job:1")
	if err != nil || string(cp.State) != `{"done":7}` || cp.Token != 1 {
		t.Fatalf("checkpoint read back: %s %d %v", cp.State, cp.Token, err)
	}
	e.hang.Store(true)
	e.clock.waitTimer(t, e.at(10*time.Second))
	e.clock.Advance(5 * time.Second)
	e.clock.waitTimer(t, e.at(32*time.Second)) // 5 s + 30 s - 3 s, not 27 s
	e.clock.Advance(22 * time.Second)
	waitDone(t, s)
	before := e.served("PUT checkpoint")
	if _, err := s.Checkpoint(context.Background(), 8); !errors.Is(err, leaseapi.ErrSessionLost) {
		t.Fatalf("Checkpoint after loss = %v", err)
	}
	if e.served("PUT checkpoint") != before {
		t.Fatal("Checkpoint after loss reached the server")
	}
}

// TestSessionCheckpointAnsweredAfterTheSessionEnded: a checkpoint whose
// answer comes after the session ended at its local deadline returns the
// session's error, not the renewed lease: the state was saved, but the
// session no longer works under the lease (Transport refuses, nothing
// renews it), and a worker that trusted a nil error would go on.
func TestSessionCheckpointAnsweredAfterTheSessionEnded(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	e.fail503.Store(true) // renewals are not confirmed meanwhile
	e.beforeCheckpoint = func() {
		e.clock.Advance(28 * time.Second) // past the local deadline (27 s), within the server's TTL (30 s)
		if err := s.Err(); !errors.Is(err, leaseapi.ErrSessionLost) {
			t.Errorf("Err past the deadline = %v, want lost", err)
		}
	}
	_, err := s.Checkpoint(context.Background(), map[string]int{"done": 1})
	if !errors.Is(err, leaseapi.ErrSessionLost) || !errors.Is(err, leaseapi.ErrRenewDeadline) {
		t.Fatalf("Checkpoint answered after the session ended = %v, want the session's error", err)
	}
	if cp, err := e.client.ReadCheckpoint(context.Background(), "job:1"); err != nil || string(cp.State) != `{"done":1}` {
		t.Fatalf("checkpoint read back: %s, %v; want it saved all the same", cp.State, err)
	}
}

// TestSessionCheckpointOfABadStateKeepsTheSession: a state the server
// refuses (400: not JSON it takes) is the state's fault, not the lease's:
// the session holds on. (A nil state is sent as null, which is no state.)
func TestSessionCheckpointOfABadStateKeepsTheSession(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	if _, err := s.Checkpoint(context.Background(), nil); !errors.Is(err, fencing.ErrInvalid) {
		t.Fatalf("Checkpoint of a nil state: %v, want ErrInvalid", err)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("after a refused state: %v, want the session live", err)
	}
}

func TestSessionCheckpointRefusedEndsSession(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	if _, err := e.client.Release(context.Background(), "job:1", "w1", s.Token(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(context.Background(), 1); !errors.Is(err, fencing.ErrLeaseLost) {
		t.Fatalf("Checkpoint = %v", err)
	}
	if err := s.Err(); !errors.Is(err, leaseapi.ErrSessionLost) || !errors.Is(err, fencing.ErrLeaseLost) {
		t.Fatalf("Err = %v", err)
	}
}

// Release ends the session, releases on the server with finished, and
// stops renewing; a second Release sends nothing.
func TestSessionRelease(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	ok, err := s.Release(context.Background(), true)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	waitDone(t, s)
	if err := s.Err(); !errors.Is(err, leaseapi.ErrSessionReleased) || errors.Is(err, leaseapi.ErrSessionLost) {
		t.Fatalf("Err = %v", err)
	}
	st := e.status(t)
	if st.Lease != nil || st.Previous == nil || *st.Previous != (fencing.Previous{Owner: "w1", Token: 1, Ended: fencing.EndReleased, Finished: true}) {
		t.Fatalf("status after release: %+v %+v", st.Lease, st.Previous)
	}
	released := e.served("POST release")
	if ok, err := s.Release(context.Background(), true); ok || !errors.Is(err, leaseapi.ErrSessionReleased) || e.served("POST release") != released {
		t.Fatalf("second Release = %v, %v", ok, err)
	}
	e.clock.Advance(time.Minute)
	if e.served("POST renew") != 0 {
		t.Fatal("a released session renewed")
	}
}

// An acquisition that the server held longer than a third of the TTL (it
// waited for the lease to free) is confirmed by a second acquire, so the
// local deadline counts from a recent send time.
func TestSessionConfirmsSlowAcquisition(t *testing.T) {
	e := newSessionEnv(t)
	e.afterAcq = func(n int) {
		if n == 1 {
			e.clock.Advance(15 * time.Second) // the server waited 15 s
		}
	}
	s := e.session(t, "w1")
	if got := e.served("POST acquire"); got != 2 {
		t.Fatalf("%d acquires, want 2", got)
	}
	e.clock.waitTimer(t, e.at(25*time.Second)) // renewal 10 s after the confirming acquire
	if s.Token() != 1 {
		t.Fatalf("token %d", s.Token())
	}
}

func TestSessionOptionsChecked(t *testing.T) {
	e := newSessionEnv(t)
	for _, o := range []leaseapi.SessionOptions{
		{TTL: 1500 * time.Millisecond},
		{TTL: 30 * time.Second, Margin: 20 * time.Second},
		{TTL: 30 * time.Second, Margin: -time.Second},
	} {
		o.Clock = e.clock
		if _, err := leaseapi.NewSession(context.Background(), e.client, "job:1", o); !errors.Is(err, fencing.ErrInvalid) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	if n := e.served("POST acquire"); n != 0 {
		t.Fatalf("bad options reached the server %d times", n)
	}
	if a, b := leaseapi.DefaultOwner(), leaseapi.DefaultOwner(); a == b || fencing.ValidateOwner(a) != nil {
		t.Fatalf("DefaultOwner: %q, %q", a, b)
	}
}

// recordingTransport is the network as a fenced transport sees it: it
// records every request and answers 200.
type recordingTransport struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	rt.reqs = append(rt.reqs, r)
	rt.mu.Unlock()
	if r.Body != nil {
		_ = r.Body.Close()
	}
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Header: http.Header{}, Request: r}, nil
}

func (rt *recordingTransport) sent() []*http.Request {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return append([]*http.Request(nil), rt.reqs...)
}

// closeBody records whether a request body was closed.
type closeBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *closeBody) Close() error { b.closed.Store(true); return nil }

func TestTransportStampsUnsafeRequests(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	net := &recordingTransport{}
	hc := &http.Client{Transport: s.Transport(net)}
	for _, m := range []string{"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "POST", "PATCH", "DELETE", "put", "PROPPATCH"} {
		req, _ := http.NewRequest(m, "http://gate.invalid/jobs/1", nil)
		req.Header.Set("Fencing-Token", "999") // replaced on fenced requests
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		resp.Body.Close()
		if req.Header.Get("Fencing-Token") != "999" || req.Header.Get("Fencing-Resource") != "" {
			t.Fatalf("%s: the caller's request was modified: %v", m, req.Header)
		}
		sent := net.sent()
		got := sent[len(sent)-1].Header
		safe := m == "GET" || m == "HEAD" || m == "OPTIONS" || m == "TRACE"
		switch {
		case safe && (got.Get("Fencing-Token") != "999" || got.Get("Fencing-Resource") != ""):
			t.Fatalf("%s: a safe request was stamped: %v", m, got)
		case !safe && (got.Get("Fencing-Token") != "1" || got.Get("Fencing-Resource") != "job:1"):
			t.Fatalf("%s: fenced request sent with %v", m, got)
		}
	}
	// The caller's token or resource in another spelling does not go out
	// beside the session's; a destination token does, as set.
	req, _ := http.NewRequest("COPY", "http://gate.invalid/jobs/1", nil)
	req.Header["fencing-token"] = []string{"998"}
	req.Header["Fencing_Token"] = []string{"997"}
	req.Header["FENCING-RESOURCE"] = []string{"other:1"}
	req.Header["Fencing_Destination_Token"] = []string{"996"}
	req.Header.Set("Fencing-Destination-Token", "995")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sent := net.sent()
	got := sent[len(sent)-1].Header
	want := http.Header{"Fencing-Token": {"1"}, "Fencing-Resource": {"job:1"}, "Fencing-Destination-Token": {"995"}}
	for k, v := range got {
		if strings.HasPrefix(strings.ToLower(strings.ReplaceAll(k, "_", "-")), "fencing-") && (len(v) != 1 || want.Get(k) != v[0]) {
			t.Fatalf("a fenced request went out with %s: %q (all: %v)", k, v, got)
		}
	}
	if got.Get("Fencing-Destination-Token") != "995" {
		t.Fatalf("the caller's destination token was not sent: %v", got)
	}
	if leaseapiHeaders := [2]string{"Fencing-Token", "Fencing-Resource"}; leaseapiHeaders != [2]string{proxy.HeaderToken, proxy.HeaderResource} {
		t.Fatal("the gate reads other headers than the transport stamps")
	}
}

func TestTransportRefusesOffline(t *testing.T) {
	for _, end := range []string{"lost", "released"} {
		t.Run(end, func(t *testing.T) {
			e := newSessionEnv(t)
			s := e.session(t, "w1")
			net := &recordingTransport{}
			hc := &http.Client{Transport: s.Transport(net)}
			switch end {
			case "lost":
				e.hang.Store(true)
				e.clock.Advance(27 * time.Second)
			case "released":
				if _, err := s.Release(context.Background(), false); err != nil {
					t.Fatal(err)
				}
			}
			body := &closeBody{Reader: strings.NewReader(`{"step":2}`)}
			req, _ := http.NewRequest("PUT", "http://gate.invalid/jobs/1", body)
			resp, err := hc.Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatal("a fenced request was sent after the session ended")
			}
			if !errors.Is(err, leaseapi.ErrWriteRefused) || !errors.Is(err, s.Err()) && !errors.Is(err, leaseapi.ErrSessionReleased) {
				t.Fatalf("error %v", err)
			}
			if n := len(net.sent()); n != 0 {
				t.Fatalf("%d requests reached the network", n)
			}
			if !body.closed.Load() {
				t.Fatal("the refused request's body was not closed")
			}
			resp, err = hc.Get("http://gate.invalid/jobs/1") // reads are not fenced
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if n := len(net.sent()); n != 1 {
				t.Fatalf("%d requests sent, want the read", n)
			}
		})
	}
}

// Many goroutines write through one transport while the session is lost:
// every request either went out stamped before the loss or was refused.
func TestTransportConcurrentWithLoss(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	net := &recordingTransport{}
	hc := &http.Client{Transport: s.Transport(net)}
	e.hang.Store(true)
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				resp, err := hc.Post("http://gate.invalid/jobs/1", "application/json", strings.NewReader("{}"))
				if err != nil {
					if !errors.Is(err, leaseapi.ErrWriteRefused) {
						t.Error(err)
						return
					}
					refused.Add(1)
					continue
				}
				resp.Body.Close()
			}
		}()
	}
	e.clock.Advance(27 * time.Second)
	wg.Wait()
	lostAfter := len(net.sent())
	resp, err := hc.Post("http://gate.invalid/jobs/1", "application/json", strings.NewReader("{}"))
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, leaseapi.ErrWriteRefused) || len(net.sent()) != lostAfter || int64(lostAfter)+refused.Load() != 16*50 {
		t.Fatalf("sent %d, refused %d, last error %v", lostAfter, refused.Load(), err)
	}
	for _, r := range net.sent() {
		if r.Header.Get("Fencing-Token") != "1" {
			t.Fatalf("unstamped write: %v", r.Header)
		}
	}
}

// failedRenewalsUntilLost moves the clock through the retries of failing
// renewals, every 2 s (TTL/15) from first, to the session's deadline, and
// waits for the session to end there.
func (e *sessionEnv) failedRenewalsUntilLost(t *testing.T, s *leaseapi.Session, first, deadline time.Duration) {
	t.Helper()
	for at := first; at < deadline; at += 2 * time.Second {
		e.clock.waitTimer(t, e.at(at))
		e.clock.Advance(2 * time.Second)
	}
	e.clock.waitTimer(t, e.at(deadline))
	e.clock.Advance(time.Second)
	waitDone(t, s)
}

// TestSessionBelievesOnlyItsOwnLease: a renewal answered with another
// lease (another token and resource) or with a redirect is not believed:
// the token stays, and the session is lost at its deadline as if every
// renewal had failed. One answered with its own lease but a TTL far longer
// than the session's moves the deadline by the session's TTL only.
func TestSessionBelievesOnlyItsOwnLease(t *testing.T) {
	answer := func(body string) func(w http.ResponseWriter, r *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body)
		}
	}
	const dayLong = `{"resource":"job:1","owner":"w1","token":TOKEN,"ttl_seconds":86400,"acquired_at":"2026-01-01T00:00:00.000Z","expires_at":"2026-01-02T00:00:00.000Z"}`
	for name, lie := range map[string]func(w http.ResponseWriter, r *http.Request){
		"another lease": answer(strings.Replace(dayLong, `"resource":"job:1","owner":"w1","token":TOKEN`, `"resource":"other:9","owner":"w1","token":999999`, 1)),
		"a redirect": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/v1/leases/job:1", http.StatusFound)
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newSessionEnv(t)
			s := e.session(t, "w1")
			token := s.Token()
			e.lie.Store(&lie)
			// The renewal at 10 s, then retries every 2 s (TTL/15), to
			// the deadline at 27 s (the TTL less its tenth).
			e.clock.waitTimer(t, e.at(10*time.Second))
			e.clock.Advance(10 * time.Second)
			e.failedRenewalsUntilLost(t, s, 12*time.Second, 27*time.Second)
			if !errors.Is(s.Err(), leaseapi.ErrSessionLost) {
				t.Fatalf("session after renewals answered with %s: %v, want lost at its deadline", name, s.Err())
			}
			if s.Token() != token || s.Lease().Resource != "job:1" {
				t.Fatalf("the session took token %d on %s from an answer it should not believe (its own %d)", s.Token(), s.Lease().Resource, token)
			}
			// At 10 s, then every 2 s to 26 s; the last may be cut off by
			// the deadline before it reaches the server.
			if got := e.served("POST renew"); got < 8 {
				t.Fatalf("%d renewals reached the server, want 8 or 9", got)
			}
		})
	}
	t.Run("its own lease, a day long", func(t *testing.T) {
		e := newSessionEnv(t)
		s := e.session(t, "w1")
		lie := answer(strings.Replace(dayLong, "TOKEN", s.Token().String(), 1))
		e.lie.Store(&lie)
		e.clock.waitTimer(t, e.at(10*time.Second))
		e.clock.Advance(10 * time.Second) // renewed at 10 s: deadline 37 s, not a day
		e.clock.waitTimer(t, e.at(20*time.Second))
		e.lie.Store(nil)
		e.fail503.Store(true) // from here on every renewal fails
		e.clock.Advance(10 * time.Second)
		e.failedRenewalsUntilLost(t, s, 22*time.Second, 37*time.Second)
		if !errors.Is(s.Err(), leaseapi.ErrSessionLost) {
			t.Fatalf("after a renewal answered with a day-long TTL, then failures: %v, want lost 27 s after that renewal", s.Err())
		}
	})
}

// TestSessionRenewsByItsOwnTTL: an acquisition answered with a TTL far
// longer than asked for (a day for 30 s) is not believed, for the deadline
// nor for the renewals: the session renews every 10 s, not every 8 hours
// (which would leave it lost at its 27 s deadline without a renewal sent).
func TestSessionRenewsByItsOwnTTL(t *testing.T) {
	e := newSessionEnv(t)
	e.acquireTTL.Store(86400)
	s := e.session(t, "w1")
	for i := 1; i <= 3; i++ {
		e.clock.waitTimer(t, e.at(time.Duration(i)*10*time.Second))
		e.clock.Advance(10 * time.Second)
	}
	e.clock.waitTimer(t, e.at(40*time.Second))
	if err := s.Err(); err != nil || e.served("POST renew") != 3 {
		t.Fatalf("after 30 s: err %v, %d renewals; want a live session renewed 3 times", err, e.served("POST renew"))
	}
}

// TestSessionBelievesAShorterTTL: a renewal answered with the session's own
// lease but a TTL shorter than asked for (5 s for 30 s) says the server now
// expires the lease 5 s after handling it, sooner than the session's
// deadline from the last renewal: the session believes the shorter one and
// is lost at 10 s + 5 s - 3 s = 12 s, not at 27 s or later.
func TestSessionBelievesAShorterTTL(t *testing.T) {
	e := newSessionEnv(t)
	s := e.session(t, "w1")
	lie := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"resource":"job:1","owner":"w1","token":`+s.Token().String()+`,"ttl_seconds":5,"acquired_at":"2026-03-01T12:00:00.000Z","expires_at":"2026-03-01T12:00:15.000Z"}`)
	}
	e.lie.Store(&lie)
	e.clock.waitTimer(t, e.at(10*time.Second))
	e.clock.Advance(10 * time.Second)
	e.clock.waitTimer(t, e.at(12*time.Second))
	if err := s.Err(); err != nil {
		t.Fatalf("lost before the shortened deadline: %v", err)
	}
	e.clock.Advance(2 * time.Second)
	waitDone(t, s)
	if err := s.Err(); !errors.Is(err, leaseapi.ErrRenewDeadline) {
		t.Fatalf("Err = %v, want the local deadline", err)
	}
}
