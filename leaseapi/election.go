package leaseapi

import (
	"context"
	"errors"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// ElectionOptions configure Campaign.
type ElectionOptions struct {
	// Session configures each term's session. Its Wait, zero here, means
	// fencing.MaxWait: a candidate waits on the server for the lease to
	// free, then asks again. Give every candidate its own Owner (the
	// default, DefaultOwner, is unique per session).
	Session SessionOptions
	// ReleaseTimeout bounds the release that ends a term, in real time;
	// zero means the lease's TTL.
	ReleaseTimeout time.Duration
	// OnStepDown, when set, is called after each term, once the lease has
	// been released, with the term's lease and why it ended: the lead
	// function's error, or the session's loss (matching ErrSessionLost),
	// or nil when lead returned nil while still leading.
	OnStepDown func(lease fencing.Lease, err error)
	// OnAcquireError, when set, is called with each acquisition that
	// failed for another reason than a held lease (the API unreachable, a
	// store fault, a refused credential), before the pause that precedes
	// the next attempt: without it such failures are only retried, and a
	// candidate that cannot reach the API waits without a sign.
	OnAcquireError func(err error)
}

// Campaign runs a leader election on resource until ctx ends, and returns
// ctx's error. It repeats terms: acquire the lease (waiting for it to free),
// call lead with a context that is cancelled as soon as the lease is lost
// (or ctx ends), and step down when lead returns, by releasing the lease.
// lead gets the term's Session: send writes through s.Transport, save
// progress with s.Checkpoint. After lead returns an error, or an
// acquisition fails for another reason than a held lease (reported to
// OnAcquireError), the next attempt waits Session.RetryInterval (default
// 1 s) on the session's clock; an acquisition answered lease-held is
// repeated after an AcquireBackoff pause (on the same clock), which is
// short after the server's own wait and grows when the server answers
// without waiting.
//
// One leader at a time is a property of the server's leases and of lead
// honouring its context promptly; fencing writes through the gate is what
// makes a late leader harmless. lead must return when its context is
// cancelled: the lease is not released, and no new term starts, before it
// does.
func Campaign(ctx context.Context, client *Client, resource string, opts ElectionOptions, lead func(ctx context.Context, s *Session) error) error {
	sopts := opts.Session
	if sopts.Wait == 0 {
		sopts.Wait = fencing.MaxWait
	}
	if sopts.Clock == nil {
		sopts.Clock = SystemClock{}
	}
	backoff := sopts.RetryInterval
	if backoff == 0 {
		backoff = time.Second
	}
	var held AcquireBackoff
	for ctx.Err() == nil {
		sent := sopts.Clock.Now()
		s, err := NewSession(ctx, client, resource, sopts)
		switch {
		case ctx.Err() != nil:
			if err == nil {
				// Acquired as the campaign ended: release it at once, or
				// it would be renewed for as long as the process lives.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ttl)
				_, _ = s.Release(rctx, false)
				cancel()
			}
			return ctx.Err()
		case errors.Is(err, fencing.ErrLeaseHeld):
			// The server normally waited already; one that answered at
			// once must not be hammered.
			sleep(sopts.Clock, held.Pause(err, sopts.Wait, sopts.Clock.Now().Sub(sent)), ctx.Done())
			continue
		case err != nil:
			if errors.Is(err, fencing.ErrInvalid) {
				return err // the options are wrong: retrying will not help
			}
			if opts.OnAcquireError != nil {
				opts.OnAcquireError(err)
			}
			sleep(sopts.Clock, backoff, ctx.Done())
			continue
		}
		held = AcquireBackoff{}
		if err := term(ctx, s, opts, lead); err != nil {
			sleep(sopts.Clock, backoff, ctx.Done())
		}
	}
	return ctx.Err()
}

// term runs lead for one session and steps down; it returns lead's error.
func term(ctx context.Context, s *Session, opts ElectionOptions, lead func(ctx context.Context, s *Session) error) error {
	lctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.Done():
			cancel()
		case <-lctx.Done():
		}
	}()
	err := lead(lctx, s)
	cancel()
	why := err
	if why == nil && errors.Is(s.Err(), ErrSessionLost) {
		why = s.Err()
	}
	timeout := opts.ReleaseTimeout
	if timeout == 0 {
		timeout = s.ttl
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	_, _ = s.Release(rctx, false)
	rcancel()
	if opts.OnStepDown != nil {
		opts.OnStepDown(s.Lease(), why)
	}
	return err
}
