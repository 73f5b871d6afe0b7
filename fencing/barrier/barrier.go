// Package barrier is the write gate's in-flight barrier (DESIGN §1.3). A
// proxy checks a write's token and then forwards it: two steps. Between
// them a higher-token write for the same resource could overtake a
// lower-token one that was admitted first. The barrier closes that window
// within one process: a write registers before its admission check, and is
// forwarded only once no lower-token write for its resource is in flight.
//
// Limits: the barrier orders writes through one process only. Several gates
// in front of one data store share the store's high-water mark but not this
// barrier.
package barrier

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// ErrTimeout: the bounded wait behind a lower-token write ran out.
var ErrTimeout = errors.New("barrier wait exceeded")

// Barrier is the in-flight barrier of one gate. Per resource
// it counts the writes in flight by token. A write registers before its
// admission check and may be forwarded only once no write with a lower
// token is registered for its resource; equal tokens never wait for each
// other. Resources with nothing in flight are dropped from the map, so its
// size is bounded by the number of writes in flight (plus those held for a
// grace period after an ambiguous upstream outcome).
type Barrier struct {
	mu  sync.Mutex
	res map[string]*inflight
}

type inflight struct {
	count map[fencing.Token]int // tokens in flight, and how many writes carry each
	// changed is closed (and cleared) whenever a write leaves, to wake the
	// writes waiting on this resource. Nil while nobody waits.
	changed chan struct{}
	// heldUntil is when the latest Hold on this resource ends.
	heldUntil time.Time
}

// New returns an empty barrier. It is safe for concurrent use.
func New() *Barrier { return &Barrier{res: map[string]*inflight{}} }

// Ticket is one write's place in the barrier. Its methods are safe to call
// more than once and from any goroutine: only the first Leave or Hold
// counts.
type Ticket struct {
	b        *Barrier
	resource string
	token    fencing.Token
	once     sync.Once
}

// Register records a write with token on resource as in flight. The caller
// must end the Ticket with Leave or Hold.
func (b *Barrier) Register(resource string, token fencing.Token) *Ticket {
	b.mu.Lock()
	f := b.res[resource]
	if f == nil {
		f = &inflight{count: make(map[fencing.Token]int, 1)}
		b.res[resource] = f
	}
	f.count[token]++
	b.mu.Unlock()
	return &Ticket{b: b, resource: resource, token: token}
}

// lowerInFlight reports whether f has a write with a token below t.
func (f *inflight) lowerInFlight(t fencing.Token) bool {
	for tok := range f.count {
		if tok < t {
			return true
		}
	}
	return false
}

// Wait blocks until no write with a lower token than the Ticket's is in
// flight for its resource, the timeout passes (ErrTimeout) or ctx
// ends (ctx.Err()). The Ticket stays registered either way.
func (t *Ticket) Wait(ctx context.Context, timeout time.Duration) error {
	b := t.b
	var timer *time.Timer
	for {
		b.mu.Lock()
		f := b.res[t.resource]
		if !f.lowerInFlight(t.token) {
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		ch := f.changed
		b.mu.Unlock()
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

// Leave deregisters the write now and wakes the writes waiting on its
// resource.
func (t *Ticket) Leave() {
	t.once.Do(t.b.leave(t))
}

// Hold keeps the write registered for d more, then deregisters it: the
// upstream may still apply a write whose outcome the gate did not see, and
// a higher-token write must not overtake it.
func (t *Ticket) Hold(d time.Duration) {
	t.once.Do(func() {
		if d <= 0 {
			t.b.leave(t)()
			return
		}
		t.b.mu.Lock()
		if f := t.b.res[t.resource]; f != nil {
			f.heldUntil = later(f.heldUntil, time.Now().Add(d))
		}
		t.b.mu.Unlock()
		time.AfterFunc(d, t.b.leave(t))
	})
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// HeldUntil is when the last Hold on resource ends, or the zero time when
// none is pending: a refused writer can be told when to retry.
func (b *Barrier) HeldUntil(resource string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f := b.res[resource]; f != nil && time.Now().Before(f.heldUntil) {
		return f.heldUntil
	}
	return time.Time{}
}

func (b *Barrier) leave(t *Ticket) func() {
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		f := b.res[t.resource]
		if f.count[t.token]--; f.count[t.token] == 0 {
			delete(f.count, t.token)
		}
		if f.changed != nil {
			close(f.changed)
			f.changed = nil
		}
		if len(f.count) == 0 {
			delete(b.res, t.resource)
		}
	}
}

// Registered is how many writes with token are registered for resource.
func (b *Barrier) Registered(resource string, token fencing.Token) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f := b.res[resource]; f != nil {
		return f.count[token]
	}
	return 0
}

// Size is the number of resources with writes in flight.
func (b *Barrier) Size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.res)
}
