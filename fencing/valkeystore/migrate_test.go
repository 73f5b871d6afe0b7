package valkeystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// slotOwner finds which of cl's primaries holds slot (by CLUSTER NODES on
// the first node) and returns its index and every primary's node ID.
func slotOwner(t *testing.T, cl *valkeytest.Cluster, slot int) (int, []string) {
	t.Helper()
	ids := make([]string, len(cl.Nodes))
	owner := -1
	for i, n := range cl.Nodes {
		ids[i] = strings.TrimSpace(n.MustDo("CLUSTER", "MYID"))
		for _, ln := range strings.Split(n.MustDo("CLUSTER", "NODES"), "\n") {
			f := strings.Fields(ln)
			if len(f) < 9 || !strings.Contains(f[2], "myself") {
				continue
			}
			for _, r := range f[8:] {
				var lo, hi int
				if k, _ := fmt.Sscanf(r, "%d-%d", &lo, &hi); k == 2 && lo <= slot && slot <= hi {
					owner = i
				} else if k == 1 && lo == slot {
					owner = i
				}
			}
		}
	}
	if owner < 0 {
		t.Fatalf("no primary owns slot %d", slot)
	}
	return owner, ids
}

// migrationChecker runs acquisitions, admissions and status reads on one
// resource from several goroutines and checks every answer against what
// the calls that completed before it started had established: a new
// token above every token issued before, no admission below a confirmed
// high-water mark, no refusal of an issued token as "not issued", marks
// that never go back. Every other answer must be a store fault (refused
// or ambiguous, which the gate fails closed on).
type migrationChecker struct {
	s   *Store
	res string

	issued atomic.Int64 // the highest token a completed acquisition returned
	hw     atomic.Int64 // the highest high-water mark a completed call returned

	mu      sync.Mutex
	tokens  map[fencing.Token]string // token -> owner it was issued to
	bad     []string
	ok      map[string]int // successful calls by kind
	faults  map[string]int // store faults by kind
	refused int            // domain refusals
}

// newMigrationChecker checks the calls on res through s, whose setup
// lease (owner "setup") was issued first, with first admitted.
func newMigrationChecker(s *Store, res string, first fencing.Token) *migrationChecker {
	c := &migrationChecker{s: s, res: res, tokens: map[fencing.Token]string{first: "setup"},
		ok: map[string]int{}, faults: map[string]int{}}
	c.issued.Store(int64(first))
	c.hw.Store(int64(first))
	return c
}

func raise(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

func (c *migrationChecker) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bad = append(c.bad, fmt.Sprintf(format, args...))
}

func (c *migrationChecker) count(m map[string]int, kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m[kind]++
}

// other judges an error that is neither success nor an expected refusal.
func (c *migrationChecker) other(kind string, err error) {
	switch {
	case errors.Is(err, fencing.ErrStoreLost):
		c.fail("%s: %v (no data was lost: a migration is not a loss)", kind, err)
	case fencing.IsStoreFault(err):
		c.count(c.faults, kind)
	default:
		c.fail("%s: unexpected error %v", kind, err)
	}
}

// acquirer takes, checkpoints, uses and releases the lease as owner until
// stop is closed.
func (c *migrationChecker) acquirer(ctx context.Context, owner string, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		before := fencing.Token(c.issued.Load())
		l, err := c.s.Acquire(ctx, fencing.AcquireRequest{Resource: c.res, Owner: owner, TTL: time.Minute})
		if err != nil {
			if !errors.Is(err, fencing.ErrLeaseHeld) {
				c.other("acquire", err)
			} else {
				c.count(c.ok, "acquire-held")
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		c.count(c.ok, "acquire")
		c.mu.Lock()
		prev, seen := c.tokens[l.Token]
		c.tokens[l.Token] = owner
		c.mu.Unlock()
		switch {
		case seen && prev != owner:
			c.fail("acquire: token %d issued to %s and again to %s", l.Token, prev, owner)
		case !seen && l.Token <= before:
			c.fail("acquire: new token %d not above %d, issued before the call", l.Token, before)
		}
		// seen && prev == owner: an earlier release by owner failed, the
		// lease is still live and re-acquiring it keeps its token.
		raise(&c.issued, int64(l.Token))
		state, _ := json.Marshal(map[string]any{"token": l.Token})
		_, err = c.s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: c.res, Owner: owner, Token: l.Token, State: state})
		c.holderCall("checkpoint", owner, l.Token, err)
		c.admit(ctx, l.Token)
		_, err = c.s.Release(ctx, fencing.ReleaseRequest{Resource: c.res, Owner: owner, Token: l.Token})
		c.holderCall("release", owner, l.Token, err)
	}
}

// holderCall judges the answer to a call (kind) the live holder owner of
// tok made: lease-lost is wrong (nothing else took the lease), any other
// error must be a store fault.
func (c *migrationChecker) holderCall(kind, owner string, tok fencing.Token, err error) {
	switch {
	case err == nil:
		c.count(c.ok, kind)
	case errors.Is(err, fencing.ErrLeaseLost):
		c.fail("%s: the live holder %s (token %d) lost its lease", kind, owner, tok)
	default:
		c.other(kind, err)
	}
}

// admit admits tok and checks the answer.
func (c *migrationChecker) admit(ctx context.Context, tok fencing.Token) {
	floor := fencing.Token(c.hw.Load())
	issued := fencing.Token(c.issued.Load())
	a, err := c.s.Admit(ctx, fencing.AdmitRequest{Resource: c.res, Token: tok})
	c.judge("admit", tok, floor, issued, a, err)
}

// admitBatch admits toks in one AdmitBatch call (whose first step reads the
// marks alone, one key, while the migration may have split the record's
// keys) and checks every answer.
func (c *migrationChecker) admitBatch(ctx context.Context, toks ...fencing.Token) {
	floor := fencing.Token(c.hw.Load())
	issued := fencing.Token(c.issued.Load())
	reqs := make([]fencing.AdmitRequest, len(toks))
	for i, tok := range toks {
		reqs[i] = fencing.AdmitRequest{Resource: c.res, Token: tok}
	}
	out, errs := make([]fencing.Admission, len(toks)), make([]error, len(toks))
	c.s.AdmitBatch(ctx, reqs, out, errs)
	for i, tok := range toks {
		c.judge("admit batch", tok, floor, issued, out[i], errs[i])
	}
}

// judge checks the answer to admitting tok, given the mark and the newest
// token confirmed before the call.
func (c *migrationChecker) judge(kind string, tok, floor, issued fencing.Token, a fencing.Admission, err error) {
	switch {
	case err == nil:
		c.count(c.ok, kind)
		if tok < floor || a.HighWater < floor {
			c.fail("%s: token %d admitted (mark %d) below the mark %d confirmed before the call", kind, tok, a.HighWater, floor)
		}
		raise(&c.hw, int64(a.HighWater))
	case errors.Is(err, fencing.ErrStaleToken):
		c.mu.Lock()
		c.refused++
		c.mu.Unlock()
	case errors.Is(err, fencing.ErrTokenNotIssued):
		if tok <= issued {
			c.fail("%s: token %d, issued before the call, refused as not issued: %v", kind, tok, err)
		}
	default:
		c.other(kind, err)
	}
}

// admitter admits the newest token and older ones until stop is closed.
func (c *migrationChecker) admitter(ctx context.Context, first fencing.Token, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		tok := fencing.Token(c.issued.Load())
		switch i % 3 {
		case 0:
			c.admit(ctx, first) // stale once a newer token was admitted
		case 1:
			c.admit(ctx, tok)
		case 2:
			c.admitBatch(ctx, tok, fencing.Token(c.hw.Load()), first)
		}
	}
}

// watcher reads the status until stop is closed: the marks it reads never
// go below the ones completed calls had confirmed.
func (c *migrationChecker) watcher(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		floor, issued := fencing.Token(c.hw.Load()), fencing.Token(c.issued.Load())
		st, err := c.s.Status(ctx, c.res)
		if err != nil {
			c.other("status", err)
			continue
		}
		c.count(c.ok, "status")
		if st.HighWater < floor || st.Issued < issued {
			c.fail("status: marks issued %d high-water %d, below %d and %d confirmed before the call", st.Issued, st.HighWater, issued, floor)
		}
		raise(&c.hw, int64(st.HighWater))
	}
}

// pause lets the workers run through a phase of the test.
func pause() { time.Sleep(300 * time.Millisecond) }

// start runs two acquirers, two admitters and a watcher until the
// function it returns is called; that function waits for them.
func (c *migrationChecker) start(ctx context.Context, first fencing.Token) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { c.acquirer(ctx, fmt.Sprint("worker", i), done) })
	}
	for range 2 {
		wg.Go(func() { c.admitter(ctx, first, done) })
	}
	wg.Go(func() { c.watcher(ctx, done) })
	return func() { close(done); wg.Wait() }
}

// report fails t with every wrong answer seen, and when the workers never
// succeeded (the test would have checked nothing).
func (c *migrationChecker) report(t *testing.T) {
	t.Helper()
	for _, b := range c.bad {
		t.Error(b)
	}
	t.Logf("successes %v; store faults %v; stale refusals %d", c.ok, c.faults, c.refused)
	if c.ok["acquire"] == 0 || c.ok["admit"] == 0 || c.ok["admit batch"] == 0 || c.ok["status"] == 0 {
		t.Fatalf("the workers never succeeded (%v): the test checked nothing", c.ok)
	}
}

// TestClusterSlotMigration moves the slot of a resource to another
// primary the way redis-cli --cluster reshard does (SETSLOT IMPORTING and
// MIGRATING, MIGRATE of its keys, SETSLOT NODE), while acquisitions,
// checkpoints, releases, admissions and status reads run on it from
// several goroutines. Half-way, the record key has moved and the
// checkpoint state key has not: every operation on the resource must then
// be refused as a store fault (the server answers TRYAGAIN), never run on
// half a record. Throughout, every answer is correct or a store fault;
// tokens are never issued twice and rise; marks never go back.
func TestClusterSlotMigration(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	prefix := freshPrefix()
	s := open(t, cl.URL(), prefix)
	ctx := context.Background()
	res := "migrating"
	first := mustAcquire(t, s, res, "setup")
	if _, err := s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: res, Owner: "setup", Token: first.Token, State: json.RawMessage(`"before"`)}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	mustAdmit(t, s, res, first.Token)
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "setup", Token: first.Token}); err != nil {
		t.Fatalf("Release: %v", err)
	}

	var slot int
	if _, err := fmt.Sscan(cl.Nodes[0].MustDo("CLUSTER", "KEYSLOT", s.recKey(res)), &slot); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{s.stateKey(res), s.liveKey(res), s.barKey(res)} {
		if got := cl.Nodes[0].MustDo("CLUSTER", "KEYSLOT", k); got != fmt.Sprint(slot) {
			t.Fatalf("%s is in slot %s, the record in %d: a resource's keys must share a slot", k, got, slot)
		}
	}
	src, ids := slotOwner(t, cl, slot)
	dst := (src + 1) % len(cl.Nodes)
	source, target := cl.Nodes[src], cl.Nodes[dst]
	host, port, _ := net.SplitHostPort(target.Addr())

	c := newMigrationChecker(s, res, first.Token)
	stop := c.start(ctx, first.Token)

	pause()
	target.MustDo("CLUSTER", "SETSLOT", fmt.Sprint(slot), "IMPORTING", ids[src])
	source.MustDo("CLUSTER", "SETSLOT", fmt.Sprint(slot), "MIGRATING", ids[dst])
	pause()

	// Move the record alone, between two operations of the workers (the
	// server runs MIGRATE atomically with respect to scripts).
	source.MustDo("MIGRATE", host, port, "", "0", "5000", "KEYS", s.recKey(res))
	if got := source.MustDo("EXISTS", s.stateKey(res)); got != "1" {
		t.Fatalf("the checkpoint state key is not on the source after moving the record alone (EXISTS %s): the split was not set up", got)
	}
	// Split: the record is on the target, its state on the source. Every
	// operation is refused (the server answers TRYAGAIN, which valkey-go's
	// cluster client sends again until the command timeout), none answers
	// from half a record. Side by side: each waits out the timeout.
	var splitChecks sync.WaitGroup
	for name, op := range map[string]func() error{
		"acquire": func() error {
			_, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "split", TTL: time.Minute})
			return err
		},
		"admit": func() error {
			_, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: fencing.Token(c.issued.Load())})
			return err
		},
		"status": func() error { _, err := s.Status(ctx, res); return err },
		"checkpoint read": func() error {
			_, err := s.ReadCheckpoint(ctx, res)
			return err
		},
	} {
		splitChecks.Go(func() {
			if err := op(); !errors.Is(err, fencing.ErrUnavailable) {
				t.Errorf("%s with the record moved and its state not: %v, want a refusal (store unavailable: not performed)", name, err)
			}
		})
	}
	splitChecks.Wait()
	// AdmitBatch reads the marks alone (one key, read where it is) and may
	// admit a token at the mark from them within the retention slack of
	// the last script, else runs the script (refused here): either way,
	// never a wrong answer.
	mark := fencing.Token(c.hw.Load())
	out, errs := make([]fencing.Admission, 1), make([]error, 1)
	s.AdmitBatch(ctx, []fencing.AdmitRequest{{Resource: res, Token: mark}}, out, errs)
	if errs[0] != nil && !fencing.IsStoreFault(errs[0]) || errs[0] == nil && out[0].HighWater != mark {
		t.Errorf("AdmitBatch at the mark %d with the record moved and its state not: %+v, %v", mark, out[0], errs[0])
	}
	t.Logf("AdmitBatch at the mark during the split: %+v, %v", out[0], errs[0])
	// A call made during the split, with the move completed within its
	// command timeout, waits for it and is answered (valkey-go sends a
	// script refused with TRYAGAIN again, after a pause, until the
	// context ends: the server refused it before running anything), not
	// refused.
	patient := make(chan error, 1)
	go func() { _, err := s.Status(ctx, res); patient <- err }()
	pause()
	select {
	case err := <-patient:
		t.Fatalf("a status call made during the split returned before the move completed: %v; want it to wait for the slot", err)
	default:
	}
	var rest []string
	for _, k := range strings.Split(source.MustDo("CLUSTER", "GETKEYSINSLOT", fmt.Sprint(slot), "100"), "\n") {
		if k = strings.TrimSpace(k); k != "" {
			rest = append(rest, k)
		}
	}
	if len(rest) > 0 {
		source.MustDo(append([]string{"MIGRATE", host, port, "", "0", "5000", "KEYS"}, rest...)...)
	}
	pause()
	for _, n := range append([]*valkeytest.Server{target, source}, cl.Nodes...) {
		n.MustDo("CLUSTER", "SETSLOT", fmt.Sprint(slot), "NODE", ids[dst])
	}
	if err := <-patient; err != nil {
		t.Errorf("a status call made during the split, the move completed within its command timeout: %v, want its answer", err)
	}
	pause()
	pause()
	stop()
	t.Logf("moved slot %d from %s to %s; keys moved last: %v", slot, source.Addr(), target.Addr(), rest)
	c.report(t)

	// After the move: the resource is served by the target, whole.
	if n := source.MustDo("CLUSTER", "COUNTKEYSINSLOT", fmt.Sprint(slot)); n != "0" {
		t.Fatalf("%s keys left on the source", n)
	}
	if st := c.servedAfter(t, "the move", first.Token); st.Checkpoint == nil {
		t.Fatalf("status after the move %+v: the checkpoint is gone", st)
	}
}

// servedAfter checks that c's resource is served whole after what (a
// migration, a failover): its status holds every token and mark the
// workers saw, the first token is refused, and a new acquisition issues a
// token above the status's and is admitted. It returns the status.
func (c *migrationChecker) servedAfter(t *testing.T, what string, first fencing.Token) fencing.Status {
	t.Helper()
	st, err := c.s.Status(context.Background(), c.res)
	if err != nil {
		t.Fatalf("Status after %s: %v", what, err)
	}
	if st.Issued < fencing.Token(c.issued.Load()) || st.HighWater < fencing.Token(c.hw.Load()) {
		t.Fatalf("status after %s %+v: want issued >= %d, high-water >= %d", what, st, c.issued.Load(), c.hw.Load())
	}
	wantRefused(t, c.s, c.res, first)
	l := mustAcquire(t, c.s, c.res, "after")
	if l.Token <= st.Issued {
		t.Fatalf("token after %s %d, want > %d", what, l.Token, st.Issued)
	}
	mustAdmit(t, c.s, c.res, l.Token)
	return st
}

// TestClusterManualFailover promotes the replica of a resource's primary
// (CLUSTER FAILOVER, the coordinated failover: the replica catches up
// before it takes over) while the same workers run on the resource: every
// answer is correct or a store fault, tokens are never issued twice and
// rise, marks never go back, and no gate reports a loss.
func TestClusterManualFailover(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	prefix := freshPrefix()
	res := "failing-over"
	var slot int
	if _, err := fmt.Sscan(cl.Nodes[0].MustDo("CLUSTER", "KEYSLOT", prefix+":{"+res+"}"), &slot); err != nil {
		t.Fatal(err)
	}
	src, _ := slotOwner(t, cl, slot)
	replica := cl.AddReplica(t, src)
	s := open(t, cl.URL(), prefix)
	ctx := context.Background()
	first := mustAcquire(t, s, res, "setup")
	mustAdmit(t, s, res, first.Token)
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "setup", Token: first.Token}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	c := newMigrationChecker(s, res, first.Token)
	stop := c.start(ctx, first.Token)
	pause()
	replica.MustDo("CLUSTER", "FAILOVER")
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := replica.Do("INFO", "replication")
		if err == nil && strings.Contains(info, "role:master") {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("the replica %s was not promoted within 20s: %v %s", replica.Addr(), err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pause()
	pause()
	stop()
	c.report(t)
	if role := cl.Nodes[src].MustDo("INFO", "replication"); !strings.Contains(role, "role:slave") {
		t.Fatalf("the old primary is not a replica after the failover: the test did not fail over")
	}
	c.servedAfter(t, "the failover", first.Token)
}
