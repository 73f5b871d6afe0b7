package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// clock is the time source of a leaseKeeper: the real one in the binary,
// a fake one in tests, so that no unit test sleeps.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

// timer is the part of *time.Timer a leaseKeeper uses.
type timer interface {
	C() <-chan time.Time
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// renewer renews a lease; *leaseapi.Client is one.
type renewer interface {
	Renew(ctx context.Context, resource, owner string, token fencing.Token, ttl time.Duration) (fencing.Lease, error)
}

var _ renewer = (*leaseapi.Client)(nil)

// errLeaseLost is what leaseKeeper.keep returns, wrapped with the reason,
// once the lease can no longer be counted on.
var errLeaseLost = errors.New("lease lost")

// leaseKeeper keeps one lease alive for as long as a command runs, and
// says when it can no longer be sure it holds it.
//
// Timing, all on the local monotonic clock, never the server's timestamps:
// the lease is trusted until its local deadline, the instant the last
// confirmed acquire or renew request was sent plus the TTL, minus a
// safety margin of TTL/10 (the server started the TTL later than that, so
// the deadline falls before the server's expiry even with a client clock
// running up to 10% slow). A renewal is sent TTL/3 after the last
// confirmed one was sent; a transient failure (nothing answered, 5xx,
// store unavailable) is retried every TTL/10 until the deadline. The
// lease is lost when a renewal is refused (lease-lost or any other 4xx)
// or when the deadline passes without a confirmed renewal; a renewal still
// in flight at the deadline is abandoned.
type leaseKeeper struct {
	client   renewer
	clock    clock
	resource string
	owner    string
	token    fencing.Token
	ttl      time.Duration // whole seconds, at least fencing.MinTTL
	// warn reports a transient renewal failure that is being retried.
	warn func(err error)
}

func (k *leaseKeeper) renewEvery() time.Duration { return k.ttl / 3 }
func (k *leaseKeeper) retryEvery() time.Duration { return k.ttl / 10 }
func (k *leaseKeeper) margin() time.Duration     { return k.ttl / 10 }

// deadline is the local instant until which a lease confirmed by a
// request sent at sent can be relied on.
func (k *leaseKeeper) deadline(sent time.Time) time.Time { return sent.Add(k.ttl - k.margin()) }

// keep renews the lease, whose acquisition or last renewal was sent at
// sent, until ctx ends (it returns nil) or the lease is lost (it returns
// an error matching errLeaseLost that says why).
func (k *leaseKeeper) keep(ctx context.Context, sent time.Time) error {
	deadline := k.deadline(sent)
	next := sent.Add(k.renewEvery())
	var lastErr error
	for {
		if err := k.sleepUntil(ctx, next, deadline); err != nil {
			return k.lost(err, lastErr)
		}
		if ctx.Err() != nil {
			return nil
		}
		sent := k.clock.Now()
		err := k.renewBefore(ctx, deadline)
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			deadline, next, lastErr = k.deadline(sent), sent.Add(k.renewEvery()), nil
		case errors.Is(err, errDeadline):
			return k.lost(err, lastErr)
		case transient(err):
			lastErr = err
			if k.warn != nil {
				k.warn(err)
			}
			next = k.clock.Now().Add(k.retryEvery())
		default:
			return fmt.Errorf("%w: renewal refused: %w", errLeaseLost, err)
		}
	}
}

// errDeadline: the local deadline passed without a confirmed renewal.
var errDeadline = errors.New("not confirmed before the local deadline")

func (k *leaseKeeper) lost(err, lastErr error) error {
	if lastErr != nil {
		return fmt.Errorf("%w: %w (last renewal failure: %w)", errLeaseLost, err, lastErr)
	}
	return fmt.Errorf("%w: %w", errLeaseLost, err)
}

// sleepUntil waits until next, and returns errDeadline if deadline comes
// first (or has passed). It returns nil early when ctx ends.
func (k *leaseKeeper) sleepUntil(ctx context.Context, next, deadline time.Time) error {
	now := k.clock.Now()
	if !now.Before(deadline) {
		return errDeadline
	}
	if next.After(deadline) {
		next = deadline
	}
	if d := next.Sub(now); d > 0 {
		t := k.clock.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
	if !k.clock.Now().Before(deadline) {
		return errDeadline
	}
	return nil
}

// renewBefore sends one renewal and waits for its answer until deadline;
// past it the request is cancelled and errDeadline returned.
func (k *leaseKeeper) renewBefore(ctx context.Context, deadline time.Time) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := k.client.Renew(rctx, k.resource, k.owner, k.token, k.ttl)
		done <- err
	}()
	t := k.clock.NewTimer(deadline.Sub(k.clock.Now()))
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C():
		cancel()
		<-done
		return errDeadline
	}
}

// transient reports whether a failed call may succeed if tried again: the
// server or its store could not answer, or the outcome is unknown. A
// refusal (4xx) is final.
func transient(err error) bool {
	var pe *leaseapi.ProblemError
	if errors.As(err, &pe) {
		return pe.Status >= http.StatusInternalServerError
	}
	return errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous) || errors.Is(err, context.DeadlineExceeded)
}
