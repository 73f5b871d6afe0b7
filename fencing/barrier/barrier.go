// Package barrier is the write gate's in-flight barrier (DESIGN §1.3). A
// proxy checks a write's token and then forwards it: two steps. Between
// them a higher-token write for the same resource could overtake a
// lower-token one that was admitted first. The barrier closes that window
// within one process: a write registers before its admission check, and is
// forwarded only once no lower-token write for its resource that could
// still be forwarded is in flight.
//
// Which lower-token writes a write waits for: those registered before its
// own admission check returned (Wait takes that snapshot). A lower-token
// write that registers later starts its admission check after this write's
// check raised the high-water mark, so a store whose admissions are
// linearizable per resource (fencing.Store) refuses it, and it never needs
// waiting for. So a flood of doomed writes delays a valid one by at most one
// admission round trip of the doomed writes already registered, and writes
// refused by the store leave the barrier as soon as their answer comes back.
//
// Limits: the barrier orders writes through one process only. Several gates
// in front of one data store share the store's high-water mark but not this
// barrier. The snapshot argument relies on the store's linearizability: a
// store that lost its data between two admissions could admit the later,
// lower token (detecting that loss is the store's job).
package barrier

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// ErrTimeout: the bounded wait behind a lower-token write ran out.
var ErrTimeout = errors.New("barrier wait exceeded")

// ErrClosed: the barrier was closed (the gate is stopping); no write may be
// forwarded any more.
var ErrClosed = errors.New("barrier closed")

// Barrier is the in-flight barrier of one gate. Per resource it keeps the
// registered writes in registration order. A write registers before its
// admission check and may be forwarded only once no write with a lower
// token registered before its admission check returned is still
// registered; equal tokens never wait for each other. Resources with
// nothing registered are dropped from the map, so its size is bounded by
// the number of writes in flight (plus those held for a grace period after
// an ambiguous upstream outcome).
//
// The resources are spread over shards by a hash of their names, each
// with its own lock, so that writes on different resources from different
// CPUs (a gate's event loops) seldom wait for one lock. A resource's
// writes all live in one shard: nothing the barrier decides involves two.
type Barrier struct {
	seed   maphash.Seed
	shards [shardCount]shard
}

// shardCount is the number of a Barrier's shards, a power of two.
const shardCount = 16

// shard is the part of a Barrier that holds the resources whose names hash
// to it. closed and allUntil are the same in every shard, set in each
// under its lock.
type shard struct {
	mu     sync.Mutex
	seq    uint64 // registration counter; Ticket.seq values come from it
	res    map[string]*inflight
	closed bool
	// allUntil: every write waits until then, whatever its resource
	// (HoldAll: the gate restarted after an unclean stop).
	allUntil time.Time
	// spare is the entry of the resource left last, kept for the next
	// one: a gate whose writes rarely overlap reuses one entry rather
	// than allocating one per write.
	spare *inflight
	_     [64]byte // keeps shards' locks off each other's cache lines
}

type inflight struct {
	// head and tail link the registered tickets in registration order
	// (ascending seq).
	head, tail *Ticket
	// changed is closed (and cleared) whenever a write leaves, to wake the
	// writes waiting on this resource. Nil while nobody waits.
	changed chan struct{}
	// heldUntil is when the latest Hold on this resource ends.
	heldUntil time.Time
}

// New returns an empty barrier. It is safe for concurrent use.
func New() *Barrier {
	b := &Barrier{seed: maphash.MakeSeed()}
	for i := range b.shards {
		b.shards[i].res = map[string]*inflight{}
	}
	return b
}

// shard is resource's shard.
func (b *Barrier) shard(resource string) *shard {
	return &b.shards[maphash.String(b.seed, resource)&(shardCount-1)]
}

// Ticket is one write's place in the barrier. Its methods are safe to call
// more than once and from any goroutine: only the first Leave or Hold
// counts.
type Ticket struct {
	s        *shard
	resource string
	token    fencing.Token
	once     sync.Once
	seq      uint64 // registration order; set once by Register

	// Guarded by s.mu.
	f          *inflight // the resource's entry, while the ticket is linked in it
	prev, next *Ticket
	horizon    uint64    // Wait's snapshot: tickets with seq < horizon are waited for; 0 until Wait
	passed     bool      // Wait returned nil: the write may be forwarded
	holdUntil  time.Time // set by Hold
}

// Register records a write with token on resource as in flight. Call it
// before the write's admission check. The caller must end the Ticket with
// Leave or Hold.
func (b *Barrier) Register(resource string, token fencing.Token) *Ticket {
	t := &Ticket{s: b.shard(resource), resource: resource, token: token}
	t.s.mu.Lock()
	t.s.link(t)
	t.s.mu.Unlock()
	return t
}

// link appends t to its resource's list. s.mu must be held.
func (s *shard) link(t *Ticket) {
	f := s.res[t.resource]
	if f == nil {
		f = s.spare
		s.spare = nil
		if f == nil {
			f = &inflight{}
		}
		s.res[t.resource] = f
	}
	s.seq++
	t.seq = s.seq
	t.f = f
	if f.tail == nil {
		f.head = t
	} else {
		f.tail.next, t.prev = t, f.tail
	}
	f.tail = t
}

// blocked reports whether t must still wait: a write with a lower token
// registered before t's horizon is still registered, or every write is
// held. s.mu must be held.
func (s *shard) blocked(f *inflight, t *Ticket) bool {
	if s.allHeld() {
		return true
	}
	for x := f.head; x != nil && x.seq < t.horizon; x = x.next {
		if x.token < t.token {
			return true
		}
	}
	return false
}

// Wait blocks until no write with a lower token than the Ticket's, among
// those registered before Wait was first called, is in flight for its
// resource; the timeout passes (ErrTimeout); ctx ends (ctx.Err()); or the
// barrier is closed (ErrClosed). Call it only once the write's admission
// check has returned and admitted it: that moment is the snapshot the
// package comment explains. The Ticket stays registered either way.
func (t *Ticket) Wait(ctx context.Context, timeout time.Duration) error {
	s := t.s
	var timer *time.Timer
	for {
		s.mu.Lock()
		f, ok, err := t.pass()
		if err != nil || ok {
			s.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return err
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		ch := f.changed
		s.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(timeout)
		}
		select {
		case <-ch:
		case <-timer.C:
			return ErrTimeout
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
}

// Pass is Wait without the wait: it reports whether the write may be
// forwarded now (as Wait would return nil at once), or ErrClosed. When it
// reports false, a later Wait waits for the same writes: those registered
// before Pass was called.
func (t *Ticket) Pass() (bool, error) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	_, ok, err := t.pass()
	return ok, err
}

// pass is one check of Wait: ErrClosed, or whether t may pass now, with
// the resource's entry to wait on when it may not. s.mu must be held.
func (t *Ticket) pass() (*inflight, bool, error) {
	s := t.s
	if s.closed {
		return nil, false, ErrClosed
	}
	if t.horizon == 0 {
		t.horizon = s.seq + 1
	}
	f := s.res[t.resource]
	if s.blocked(f, t) {
		return f, false, nil
	}
	t.passed = true
	return f, true, nil
}

// Leave deregisters the write now and wakes the writes waiting on its
// resource.
func (t *Ticket) Leave() {
	t.once.Do(t.leave)
}

// Hold keeps the write registered for d more, then deregisters it: the
// upstream may still apply a write whose outcome the gate did not see, and
// a higher-token write must not overtake it.
func (t *Ticket) Hold(d time.Duration) {
	t.once.Do(func() {
		if d <= 0 {
			t.leave()
			return
		}
		t.s.mu.Lock()
		t.holdUntil = time.Now().Add(d)
		t.f.heldUntil = later(t.f.heldUntil, t.holdUntil)
		t.s.mu.Unlock()
		time.AfterFunc(d, t.leave)
	})
}

// HoldResource keeps resource closed to every write for d, as if a write
// with a token below every token had been held: a gate restarting uses it
// for the holds its previous run left.
func (b *Barrier) HoldResource(resource string, d time.Duration) {
	if d <= 0 {
		return
	}
	b.Register(resource, 0).Hold(d)
}

// HoldAll keeps every resource closed to every write for d: a gate that
// restarts after an unclean stop cannot know which writes were in flight.
func (b *Barrier) HoldAll(d time.Duration) {
	if d <= 0 {
		return
	}
	until := time.Now().Add(d)
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		s.allUntil = later(s.allUntil, until)
		s.mu.Unlock()
	}
	time.AfterFunc(d, func() {
		for i := range b.shards {
			s := &b.shards[i]
			s.mu.Lock()
			for _, f := range s.res {
				f.wake()
			}
			s.mu.Unlock()
		}
	})
}

// AllHeldUntil is when the last HoldAll ends, or the zero time when none
// is pending.
func (b *Barrier) AllHeldUntil() time.Time {
	s := &b.shards[0] // HoldAll sets every shard's alike
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Now().Before(s.allUntil) {
		return s.allUntil
	}
	return time.Time{}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// HeldUntil is when the last Hold on resource (or HoldAll) ends, or the
// zero time when none is pending: a refused writer can be told when to
// retry.
func (b *Barrier) HeldUntil(resource string) time.Time {
	s := b.shard(resource)
	s.mu.Lock()
	defer s.mu.Unlock()
	until := s.allUntil
	if f := s.res[resource]; f != nil {
		until = later(until, f.heldUntil)
	}
	if time.Now().Before(until) {
		return until
	}
	return time.Time{}
}

func (f *inflight) wake() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// leave deregisters t and wakes the writes waiting on its resource.
func (t *Ticket) leave() {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	f := t.f
	if t.prev == nil {
		f.head = t.next
	} else {
		t.prev.next = t.next
	}
	if t.next == nil {
		f.tail = t.prev
	} else {
		t.next.prev = t.prev
	}
	t.f, t.prev, t.next = nil, nil, nil
	f.wake()
	if f.head == nil {
		delete(s.res, t.resource)
		if s.spare == nil {
			*f = inflight{} // nothing outside s.mu holds an entry
			s.spare = f
		}
	}
}

// Close stops the barrier: every pending and later Wait returns ErrClosed,
// so no write is forwarded after Close returns. It reports, per resource,
// until when writes already forwarded may still be applied by the upstream:
// the end of a write's Hold, or now+grace for a write still in flight
// (its outcome will not be seen). Writes that never passed Wait are left
// out: they were never forwarded. Holds keep running their course.
func (b *Barrier) Close(grace time.Duration) map[string]time.Time {
	now := time.Now()
	out := map[string]time.Time{}
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		s.closed = true
		for res, f := range s.res {
			f.wake()
			for x := f.head; x != nil; x = x.next {
				var until time.Time
				switch {
				case !x.holdUntil.IsZero():
					until = x.holdUntil
				case x.passed:
					until = now.Add(grace)
				default:
					continue
				}
				if until.After(now) {
					out[res] = later(out[res], until)
				}
			}
		}
		s.mu.Unlock()
	}
	return out
}

// Registered is how many writes with token are registered for resource.
func (b *Barrier) Registered(resource string, token fencing.Token) int {
	s := b.shard(resource)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	if f := s.res[resource]; f != nil {
		for x := f.head; x != nil; x = x.next {
			if x.token == token {
				n++
			}
		}
	}
	return n
}

// InFlight reports whether resource has a write registered (in flight, or
// held after an unknown outcome) or every resource is held (HoldAll): the
// barrier has an entry for it. A store's retention sweep asks it
// (fencing.InFlightKeeper) so that it never removes the record of a write
// the upstream may still apply. Since a write registers before its
// admission check, a write not yet registered when InFlight answers false
// is admitted, if at all, after that answer.
func (b *Barrier) InFlight(resource string) bool {
	s := b.shard(resource)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res[resource] != nil || s.allHeld()
}

// allHeld reports whether a HoldAll is still running (the clock is read
// only when one was ever set). s.mu must be held.
func (s *shard) allHeld() bool {
	return !s.allUntil.IsZero() && time.Now().Before(s.allUntil)
}

// Size is the number of resources with writes in flight.
func (b *Barrier) Size() int {
	n := 0
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		n += len(s.res)
		s.mu.Unlock()
	}
	return n
}
