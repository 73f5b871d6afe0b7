package proxy

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// errBarrierTimeout: the bounded wait behind a lower-token write ran out.
var errBarrierTimeout = errors.New("barrier wait exceeded")

// barrier is the in-flight barrier of one gate (DESIGN §1.3). Per resource
// it counts the writes in flight by token. A write registers before its
// admission check and may be forwarded only once no write with a lower
// token is registered for its resource; equal tokens never wait for each
// other. Resources with nothing in flight are dropped from the map, so its
// size is bounded by the number of writes in flight (plus those held for a
// grace period after an ambiguous upstream outcome).
type barrier struct {
	mu  sync.Mutex
	res map[string]*inflight
}

type inflight struct {
	count map[fencing.Token]int // tokens in flight, and how many writes carry each
	// changed is closed (and cleared) whenever a write leaves, to wake the
	// writes waiting on this resource. Nil while nobody waits.
	changed chan struct{}
}

func newBarrier() *barrier { return &barrier{res: map[string]*inflight{}} }

// ticket is one write's place in the barrier. Its methods are safe to call
// more than once and from any goroutine: only the first leave or hold
// counts.
type ticket struct {
	b        *barrier
	resource string
	token    fencing.Token
	once     sync.Once
}

// register records a write with token on resource as in flight. The caller
// must end the ticket with leave or hold.
func (b *barrier) register(resource string, token fencing.Token) *ticket {
	b.mu.Lock()
	f := b.res[resource]
	if f == nil {
		f = &inflight{count: make(map[fencing.Token]int, 1)}
		b.res[resource] = f
	}
	f.count[token]++
	b.mu.Unlock()
	return &ticket{b: b, resource: resource, token: token}
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

// wait blocks until no write with a lower token than the ticket's is in
// flight for its resource, the timeout passes (errBarrierTimeout) or ctx
// ends (ctx.Err()). The ticket stays registered either way.
func (t *ticket) wait(ctx context.Context, timeout time.Duration) error {
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
			return errBarrierTimeout
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
	}
}

// leave deregisters the write now and wakes the writes waiting on its
// resource.
func (t *ticket) leave() {
	t.once.Do(t.b.leave(t))
}

// hold keeps the write registered for d more, then deregisters it: the
// upstream may still apply a write whose outcome the gate did not see, and
// a higher-token write must not overtake it.
func (t *ticket) hold(d time.Duration) {
	t.once.Do(func() {
		if d <= 0 {
			t.b.leave(t)()
			return
		}
		time.AfterFunc(d, t.b.leave(t))
	})
}

func (b *barrier) leave(t *ticket) func() {
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

// size is the number of resources with writes in flight.
func (b *barrier) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.res)
}
