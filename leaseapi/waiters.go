package leaseapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
)

// Waiting acquisitions.
//
// An acquire with wait_seconds that finds the lease held waits in a queue
// of its resource, in arrival order, on this server. Only the head of a
// queue asks the store: it tries, and between tries sleeps until the
// holder's expiry (by the store's clock) or a poll interval growing from
// waitPollMin to waitPollMax, whichever comes first, or until a release
// served by this server frees the resource. The others sleep until it is
// their turn. So the store sees one try per resource per poll interval
// however many wait, the holder's renewals and release do not queue behind
// their tries, and waiters get the lease in the order they came (an
// acquire without a wait still takes a free lease at once: only waiters
// queue).
//
// A waiter that gives up (its wait is over, its client hung up) leaves its
// queue and, if it was the head, hands the turn to the next. One whose
// wait ends before its turn answers lease-held with the holder the queue
// last saw refuse it; it asks the store itself only when no waiter has been
// refused yet (the head's first try still out), since a try of its own
// could take a lease just freed ahead of the head. The holder is not made
// to queue for its own lease: a waiting acquisition by the owner the queue
// last saw hold it asks the store at once, and at the end of its wait, as
// an acquisition without a wait would (the store extends the lease). A waiter whose client
// hung up while the store gave it the lease releases that lease again: no
// one is left to use it. When the server stops (EndWaits), every waiter
// is answered 503 draining at once, and a call that would start waiting
// is answered at once, as without a wait.

const (
	waitPollMin = 20 * time.Millisecond
	waitPollMax = 250 * time.Millisecond
	// giveBackTimeout bounds the release of a lease acquired for a client
	// that hung up.
	giveBackTimeout = 5 * time.Second
)

// waitQueues are the queues of waiting acquisitions, by resource. A queue
// exists only while someone waits in it.
type waitQueues struct {
	mu sync.Mutex
	m  map[string]*waitQueue
}

type waitQueue struct {
	waiters []*waiter               // in arrival order; waiters[0] is the head, the one that asks the store
	held    *fencing.LeaseHeldError // the last refusal a waiter got, for those whose wait ends before their turn
}

// waiter is one waiting acquisition. turn receives when it becomes the
// head; kick receives when a release may have freed the resource.
type waiter struct {
	turn chan struct{}
	kick chan struct{}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// join queues w on resource and reports whether w is the head.
func (q *waitQueues) join(resource string, w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = make(map[string]*waitQueue)
	}
	wq := q.m[resource]
	if wq == nil {
		wq = &waitQueue{}
		q.m[resource] = wq
	}
	wq.waiters = append(wq.waiters, w)
	return len(wq.waiters) == 1
}

// leave takes w out of resource's queue; if w was the head, the next
// waiter gets the turn.
func (q *waitQueues) leave(resource string, w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	wq := q.m[resource]
	if wq == nil {
		return
	}
	for i, x := range wq.waiters {
		if x != w {
			continue
		}
		wq.waiters = append(wq.waiters[:i], wq.waiters[i+1:]...)
		if i == 0 && len(wq.waiters) > 0 {
			signal(wq.waiters[0].turn)
		}
		break
	}
	if len(wq.waiters) == 0 {
		delete(q.m, resource)
	}
}

// freed wakes the head of resource's queue, if any: a release served here
// ended the lease on it.
func (q *waitQueues) freed(resource string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if wq := q.m[resource]; wq != nil && len(wq.waiters) > 0 {
		signal(wq.waiters[0].kick)
	}
}

// noteRefusal notes held, the store's refusal of a waiter on resource.
func (q *waitQueues) noteRefusal(resource string, held *fencing.LeaseHeldError) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if wq := q.m[resource]; wq != nil {
		wq.held = held
	}
}

// lastRefusal is the last refusal a waiter on resource got, or nil.
func (q *waitQueues) lastRefusal(resource string) *fencing.LeaseHeldError {
	q.mu.Lock()
	defer q.mu.Unlock()
	if wq := q.m[resource]; wq != nil {
		return wq.held
	}
	return nil
}

// waiting returns how many acquisitions wait on resource.
func (q *waitQueues) waiting(resource string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if wq := q.m[resource]; wq != nil {
		return len(wq.waiters)
	}
	return 0
}

// acquireWait acquires req like store.Acquire but, while another owner
// holds the lease, waits for it in resource's queue up to wait (see the
// comment at the top of this file). It returns the last
// *fencing.LeaseHeldError when the wait runs out and ctx's error when ctx
// ends first, having released a lease the store gave it after ctx ended.
// Every try after the store refused the call is preceded by permit (nil:
// none), whose error ends the wait with it, nothing taken.
func (s *Server) acquireWait(ctx context.Context, req fencing.AcquireRequest, wait time.Duration, permit func() error) (fencing.Lease, error) {
	if err := fencing.ValidateWait(wait); err != nil {
		return fencing.Lease{}, err
	}
	ended := s.waitsEnded
	deadline := time.Now().Add(wait)
	w := &waiter{turn: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
	head := s.waiters.join(req.Resource, w)
	defer s.waiters.leave(req.Resource, w)

	refused := false // the store answered lease-held to this call at least once
	try := func() (fencing.Lease, *fencing.LeaseHeldError, error) {
		if refused && permit != nil {
			if err := permit(); err != nil {
				return fencing.Lease{}, nil, err
			}
		}
		lease, err := s.store.Acquire(ctx, req)
		var held *fencing.LeaseHeldError
		switch {
		case err == nil && refused && ctx.Err() != nil:
			s.giveBack(ctx, lease)
			return fencing.Lease{}, nil, ctx.Err()
		case errors.As(err, &held):
			refused = true
			s.waiters.noteRefusal(req.Resource, held)
			return fencing.Lease{}, held, nil
		}
		return lease, nil, err
	}

	// The holder itself, re-acquiring with a wait (to extend its lease, or
	// to learn the outcome of an acquisition whose answer it lost) while
	// others wait: the queue is for owners other than the holder, and the
	// store extends a live lease of the same owner at once, as it does
	// without a wait. Without this it would wait its whole wait behind the
	// queue and be refused with its own name.
	if !head {
		if held := s.waiters.lastRefusal(req.Resource); held != nil && held.Holder == req.Owner {
			if lease, held, err := try(); held == nil {
				return lease, err
			}
		}
	}

	poll := waitPollMin
	for {
		if !head {
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-ctx.Done():
				t.Stop()
				return fencing.Lease{}, ctx.Err()
			case <-ended:
				t.Stop()
				return fencing.Lease{}, errWaitsEnded()
			case <-t.C:
				// The wait is over before its turn came: the holder as
				// the queue last saw it or, with no refusal yet, as the
				// store has it now.
				if held := s.waiters.lastRefusal(req.Resource); held != nil && held.Holder != req.Owner {
					return fencing.Lease{}, held
				}
				lease, held, err := try()
				if held != nil {
					return fencing.Lease{}, held
				}
				return lease, err
			case <-w.turn:
				t.Stop()
				head = true
			}
		}
		lease, held, err := try()
		if held == nil {
			return lease, err
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return fencing.Lease{}, held
		}
		sleep := min(poll, remaining)
		if untilExpiry := held.Remaining(); untilExpiry > 0 && untilExpiry < sleep {
			sleep = untilExpiry
		}
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return fencing.Lease{}, ctx.Err()
		case <-ended:
			t.Stop()
			return fencing.Lease{}, errWaitsEnded()
		case <-w.kick:
			t.Stop()
		case <-t.C:
		}
		poll = min(poll*2, waitPollMax)
	}
}

// EndWaits answers every acquisition waiting for a lease (wait_seconds)
// 503 draining, with Retry-After, and makes a call that would wait from now
// on try once and answer at once. A server that stops calls it as its
// listeners shut down: a waiter would otherwise hold the drain for its
// whole wait, or the shutdown grace, and then find its connection cut.
// A try already at the store finishes first (a lease it got is answered).
// It cannot be undone.
func (s *Server) EndWaits() { s.endWaits.Do(func() { close(s.waitsEnded) }) }

// waitingEnded reports whether EndWaits was called.
func (s *Server) waitingEnded() bool {
	select {
	case <-s.waitsEnded:
		return true
	default:
		return false
	}
}

// errWaitsEnded is a waiter's answer once EndWaits was called.
func errWaitsEnded() error {
	return &problem.Error{Status: http.StatusServiceUnavailable, Code: "draining",
		Detail:  "fencegate is shutting down: the wait for this lease ended, nothing was taken; retry on another instance or after the restart",
		Headers: http.Header{"Retry-After": {"1"}}}
}

// giveBack releases lease, which the store gave a waiting acquisition
// after its client hung up. The lease is new (the call was refused before
// it got it), so no one else holds its token.
func (s *Server) giveBack(ctx context.Context, lease fencing.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	released, err := s.store.Release(ctx, fencing.ReleaseRequest{Resource: lease.Resource, Owner: lease.Owner, Token: lease.Token})
	if err != nil {
		s.log.LogAttrs(ctx, slog.LevelWarn, "a lease acquired for a client that hung up could not be released; it ends at its expiry",
			slog.String("resource", lease.Resource), slog.String("owner", lease.Owner), slog.String("error", err.Error()))
		return
	}
	if released {
		s.waiters.freed(lease.Resource)
	}
}
