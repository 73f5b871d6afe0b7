package fencing

import (
	"context"
	"errors"
	"time"
)

// AcquireWait acquires like Store.Acquire but, while another owner holds the
// lease, retries until it frees or wait has passed (wait is bounded by
// MaxWait). Between tries it sleeps until the holder's expiry or a short
// poll interval, whichever comes first, so a release is noticed quickly. It
// returns the last *LeaseHeldError when the wait runs out, and ctx's error
// when ctx ends first.
func AcquireWait(ctx context.Context, s Store, req AcquireRequest, wait time.Duration) (Lease, error) {
	if err := ValidateWait(wait); err != nil {
		return Lease{}, err
	}
	deadline := time.Now().Add(wait)
	poll := 20 * time.Millisecond
	for {
		lease, err := s.Acquire(ctx, req)
		var held *LeaseHeldError
		if err == nil || !errors.As(err, &held) {
			return lease, err
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return Lease{}, err
		}
		sleep := min(poll, remaining)
		if untilExpiry := held.Remaining(); untilExpiry > 0 && untilExpiry < sleep {
			sleep = untilExpiry
		}
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return Lease{}, ctx.Err()
		case <-t.C:
		}
		poll = min(poll*2, 250*time.Millisecond)
	}
}
