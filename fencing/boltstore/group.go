package boltstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

// Group commit.
//
// Every write (Acquire, Renew, Release, Checkpoint, an Admit that raises
// the mark) is a call queued on the store's committer. Concurrent calls
// share one bbolt read-write transaction and its commit, so one flush of
// the disk makes a whole group durable; each call still gets its own
// answer, and is answered only once the commit that made it durable has
// returned.
//
// Leader and followers: a call that finds no group running runs its own
// group at once (alone: at one client nothing waits for company, so the
// latency is what one transaction costs). Calls that arrive while a group
// runs queue; when the group has committed and been answered, its leader
// wakes the first queued call, which takes the queue (up to maxGroupCalls
// calls and maxGroupBytes of checkpoint state) as the next group. So while
// the disk flushes one group, the next one gathers, and the group size
// follows the load by itself, with no timer.
//
// Inside a group the calls run one after another, in queue order, each on
// the records as the calls before it left them (a bbolt transaction reads
// its own writes): the group's outcome is that of running its calls
// serially in that order, and each call's answer is given after all of
// them committed, so every call takes effect between its invocation and its
// answer (linearizable, like one transaction per call).
//
// Failures: a refusal (lease held, lease lost, stale token…) is the call's
// answer and writes nothing, so it does not touch the group. A call whose
// storage work fails (a corrupt record, a bbolt Put that fails) after it
// may have written part of its change makes the whole transaction roll
// back; that call gets its error (nothing of it was committed: not done,
// ErrUnavailable) and the others run again, without it, in a fresh
// transaction. Running a call again is safe because a call's only effects
// are on the transaction, which was rolled back, on its own result
// (overwritten by the rerun) and on pending mark-cache entries of the
// rolled-back transaction (dropped by settled before the rerun). The same
// contract as bbolt's DB.Batch, but DB.Batch waits up to MaxBatchDelay
// for company, adding that delay to every call at low load, and would
// rerun a refused call alone instead of just answering it. A failing
// commit (the flush itself) fails the whole group: every call in it gets
// ErrAmbiguous, as it would alone, since the write may have reached the
// disk. An operation that panics (a bug) fails like a storage failure, and
// its caller then panics with the same value, as it would have without
// group commit; a panic in bbolt's commit answers the group's calls with
// ErrAmbiguous and panics in the leader. Either way the transaction is
// ended and the lead passed on: the store keeps serving.
//
// A caller whose context ends while its call is still queued takes it back
// (nothing done, the context's error); once a group has taken it, the
// caller waits for the outcome.
//
// The retention sweep's removals are calls too (sweep.go): a call with
// sweep set removes a bounded set of records in the group's transaction,
// after the calls queued before it and before those queued after it, so
// it shares their commit and flush instead of holding bbolt's writer lock
// in transactions of its own, and it sees every write committed or
// queued before it. It counts as one write in CommitStats.

const (
	// maxGroupCalls bounds a group: beyond it the rest waits for the next
	// commit, so one transaction's work (and its latency) stays bounded.
	maxGroupCalls = 512
	// maxGroupBytes bounds the checkpoint state a group writes.
	maxGroupBytes = 16 << 20
)

// call is one write waiting for, or running in, a group.
type call struct {
	resource string
	// run applies the operation to r, the resource's record (lifted), in
	// tx at now, and reports whether it changed r. It keeps its result
	// itself. An error it returns as *storageError is a storage failure,
	// anything else a refusal.
	run func(tx *bolt.Tx, r *record.Record, now time.Time) (changed bool, err error)
	// sweep, set instead of resource and run, acts on tx itself (the
	// retention sweep's removals) and reports whether it wrote anything.
	// Any error it returns is a storage failure. It keeps its result
	// itself and must only act on tx, its result and the mark cache
	// (forget), since it runs again when a neighbour fails.
	sweep func(tx *bolt.Tx, now time.Time) (wrote bool, err error)
	bytes int // checkpoint state it writes, for maxGroupBytes

	// Set by the group that ran the call, read by its caller after wake.
	err error
	// panicked is what the operation panicked with, if it did: its caller
	// panics with it, as it would have without group commit.
	panicked any
	// wake receives one signal: the call was answered, or (lead) its
	// caller must run the next group.
	wake chan struct{}
	lead bool
	// state is guarded by committer.mu.
	state callState
}

type callState int

const (
	callQueued callState = iota
	callTaken            // in a group (running, or chosen to lead one)
	callCancelled
)

// committer queues calls and runs them in groups.
type committer struct {
	mu      sync.Mutex
	queue   []*call
	running bool // a group runs, or a woken leader is about to take the queue

	groups, calls atomic.Uint64 // committed groups and the calls in them
	// observe, if set, sees each committed group (ObserveCommits).
	observe atomic.Pointer[func(writes int, took time.Duration)]
}

// CommitStats counts the store's group commits since Open.
type CommitStats struct {
	// Groups is the number of transactions committed for writes, Calls
	// the writes they carried: Calls/Groups is the mean group size, the
	// number of writes one flush of the disk made durable.
	Groups, Calls uint64
}

// CommitStats returns how many group commits the store made and how many
// writes they carried. Safe for concurrent use.
func (s *Store) CommitStats() CommitStats {
	return CommitStats{Groups: s.group.groups.Load(), Calls: s.group.calls.Load()}
}

// ObserveCommits makes f see every group commit from now on: the number
// of writes it carried (as CommitStats counts them) and how long its transaction took, from its
// start to the return of its commit (the flushes included). A nil f stops
// it. f runs on the committing goroutine before the group's callers are
// answered, once per commit (not per write): it must be quick and must not
// call the store. The metrics decorator (fencing/storemetrics) feeds its
// commit histograms with it.
func (s *Store) ObserveCommits(f func(writes int, took time.Duration)) {
	if f == nil {
		s.group.observe.Store(nil)
		return
	}
	s.group.observe.Store(&f)
}

// do runs c in a group and returns its error, or ctx's error when ctx
// ended while c was still queued (c then did nothing).
func (s *Store) do(ctx context.Context, c *call) error {
	g := &s.group
	g.mu.Lock()
	if !g.running {
		g.running = true
		c.state = callTaken
		g.mu.Unlock()
		s.lead([]*call{c})
		if c.panicked != nil {
			panic(c.panicked)
		}
		return c.err
	}
	c.wake = make(chan struct{}, 1)
	g.queue = append(g.queue, c)
	g.mu.Unlock()

	select {
	case <-c.wake:
	case <-ctx.Done():
		g.mu.Lock()
		if c.state == callQueued {
			c.state = callCancelled
			g.remove(c)
			g.mu.Unlock()
			return ctx.Err()
		}
		g.mu.Unlock()
		<-c.wake // already taken: wait for its outcome
	}
	if c.lead {
		g.mu.Lock()
		group := g.take()
		g.mu.Unlock()
		s.lead(group)
	}
	if c.panicked != nil {
		panic(c.panicked)
	}
	return c.err
}

// remove drops c from the queue; mu is held.
func (g *committer) remove(c *call) {
	for i, q := range g.queue {
		if q == c {
			n := copy(g.queue[i:], g.queue[i+1:])
			g.queue[i+n] = nil
			g.queue = g.queue[:i+n]
			return
		}
	}
}

// take moves the head of the queue into a new group; mu is held.
func (g *committer) take() []*call {
	n, bytes := 0, 0
	for n < len(g.queue) && n < maxGroupCalls {
		if n > 0 && bytes+g.queue[n].bytes > maxGroupBytes {
			break
		}
		bytes += g.queue[n].bytes
		g.queue[n].state = callTaken
		n++
	}
	group := make([]*call, n)
	copy(group, g.queue[:n])
	rest := copy(g.queue, g.queue[n:])
	clear(g.queue[rest:])
	g.queue = g.queue[:rest]
	return group
}

// lead runs group, answers its calls, and hands the lead on to the first
// queued call, if any.
func (s *Store) lead(group []*call) {
	// Deferred, so that a panic in the group still answers its calls and
	// passes the lead on: the store goes on serving.
	defer s.handOff(group)
	s.commitGroup(group)
}

// handOff answers the calls of a finished group and wakes the next leader.
func (s *Store) handOff(group []*call) {
	g := &s.group
	g.mu.Lock()
	var next *call
	if len(g.queue) > 0 {
		next = g.queue[0]
		next.state = callTaken
		next.lead = true
	} else {
		g.running = false
	}
	g.mu.Unlock()
	for _, c := range group {
		if c.wake != nil && !c.lead {
			c.wake <- struct{}{}
		}
	}
	if next != nil {
		next.wake <- struct{}{}
	}
}

// commitGroup runs the calls of group in one transaction and commits it,
// setting each call's err. A call whose storage work fails is answered
// with its error and the rest run again without it (see the top of this
// file).
func (s *Store) commitGroup(group []*call) {
	live := group
	defer func() {
		if p := recover(); p != nil {
			// Not in an operation (runCall answers those): in bbolt's
			// commit. The calls still running may have been committed.
			err := fmt.Errorf("%w: store file %s: internal error committing: %v", fencing.ErrAmbiguous, s.path, p)
			s.fail(err)
			for _, c := range live {
				c.err = err
			}
			panic(p)
		}
	}()
	if err := s.failure(); err != nil { // a commit failed before: nothing runs
		for _, c := range live {
			c.err = err
		}
		return
	}
	for len(live) > 0 {
		failed := s.tryGroup(live)
		if failed < 0 {
			return
		}
		rest := make([]*call, 0, len(live)-1)
		rest = append(rest, live[:failed]...)
		live = append(rest, live[failed+1:]...)
	}
}

// tryGroup runs live in one transaction. It returns -1 when every call has
// its answer (the transaction committed, or failed as a whole), or the
// index of a call whose storage work failed: that call has its answer, the
// transaction was rolled back, and the others must run again.
func (s *Store) tryGroup(live []*call) int {
	began := time.Now()
	tx, err := s.db.Begin(true)
	if err != nil {
		err = s.classify(err, false)
		for _, c := range live {
			c.err = err
		}
		return -1
	}
	// Ends tx if a panic leaves it open (after Commit or Rollback it is a
	// no-op), so that bbolt's writer lock is not held forever.
	defer tx.Rollback()
	txid := tx.ID()
	var (
		touched []string // resources this transaction put in the mark cache
		wrote   bool
		raised  bool
		top     fencing.Token
	)
	settle := func(committed bool) {
		for _, res := range touched {
			s.marks.settled(res, txid, committed)
		}
	}
	for i, c := range live {
		c.err = nil
		r, changed, err := s.runCall(tx, c)
		if err != nil {
			var se *storageError
			if !errors.As(err, &se) {
				c.err = err // a refusal: it wrote nothing
				continue
			}
			_ = tx.Rollback()
			settle(false)
			c.err = s.classify(se.err, false)
			return i
		}
		if !changed {
			continue
		}
		wrote = true
		if r.rec == nil {
			continue // a sweep: no record to cache
		}
		if r.bumped {
			raised = true
			top = max(top, r.rec.Issued)
		}
		s.marks.saving(c.resource, r.rec, txid)
		touched = append(touched, c.resource)
	}
	if !wrote {
		_ = tx.Rollback() // nothing to write: no commit, no flush
		return -1
	}
	var next lineage
	if raised {
		var err error
		if next, err = s.nextLineage(tx, top); err != nil {
			_ = tx.Rollback()
			settle(false)
			err = s.classify(err, false)
			for _, c := range live {
				if c.err == nil {
					c.err = err
				}
			}
			return -1
		}
	}
	if s.hooks.beforeCommit != nil {
		s.hooks.beforeCommit(len(live))
	}
	if err := tx.Commit(); err != nil {
		settle(false)
		s.fail(err)
		err = s.classify(err, true)
		for _, c := range live {
			if c.err == nil {
				c.err = err
			}
		}
		return -1
	}
	settle(true)
	s.group.groups.Add(1)
	s.group.calls.Add(uint64(len(live)))
	if f := s.group.observe.Load(); f != nil {
		(*f)(len(live), time.Since(began))
	}
	if raised {
		s.committed(next)
	}
	return -1
}

// ran is what one call did to its record.
type ran struct {
	rec    *record.Record // nil for a sweep
	bumped bool           // issued or the mark moved: the lineage generation moves
}

// runCall runs c in tx: loads the record, applies the operation, and saves
// the record when the operation changed it (a sweep call acts on tx
// itself). A storage failure comes back as *storageError; a refusal as
// itself.
func (s *Store) runCall(tx *bolt.Tx, c *call) (_ ran, _ bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			// A bug in the operation: it fails alone (its caller panics
			// with p, see do), the group goes on without it.
			c.panicked = p
			err = &storageError{fmt.Errorf("panic: %v", p)}
		}
	}()
	now := s.clock.Now()
	if c.sweep != nil {
		wrote, err := c.sweep(tx, now)
		if err != nil {
			return ran{}, false, &storageError{err}
		}
		return ran{}, wrote, nil
	}
	r, err := s.load(tx, c.resource, now)
	if err != nil {
		return ran{}, false, &storageError{err}
	}
	r.Lift(s.floor, now) // a new record starts at the floor
	issued, hw := r.Issued, r.HighWater
	changed, err := c.run(tx, r, now)
	if err != nil || !changed {
		return ran{}, false, err
	}
	if err := save(tx, c.resource, r); err != nil {
		return ran{}, false, &storageError{err}
	}
	if s.hooks.afterSave != nil {
		if err := s.hooks.afterSave(c.resource); err != nil {
			return ran{}, false, &storageError{err}
		}
	}
	return ran{rec: r, bumped: r.Issued != issued || r.HighWater != hw}, true, nil
}
