package leaseapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// Session errors. A session that ended reports why through Err, always
// matching exactly one of ErrSessionLost and ErrSessionReleased.
var (
	// ErrSessionLost: the session no longer holds its lease, or can no
	// longer be sure it does. The error also matches fencing.ErrLeaseLost
	// when the server refused a renewal, and ErrRenewDeadline when no
	// renewal was confirmed in time.
	ErrSessionLost = errors.New("leaseapi: lease lost")
	// ErrRenewDeadline: no acquisition or renewal was confirmed before the
	// session's local deadline (see SessionOptions.Margin). The server may
	// still count the lease as live for a little while; the session does
	// not, so it never acts on a lease the server has already expired.
	ErrRenewDeadline = errors.New("no renewal confirmed before the local deadline")
	// ErrSessionReleased: Release was called.
	ErrSessionReleased = errors.New("leaseapi: session released")
)

// SessionOptions configure a Session.
type SessionOptions struct {
	// Owner names the worker. Empty means DefaultOwner(), unique per
	// session.
	Owner string
	// TTL is the lease duration, whole seconds within [1 s, 24 h]; zero
	// means the server's default. The session renews every TTL/3.
	TTL time.Duration
	// Wait lets the acquisition wait, up to fencing.MaxWait, for another
	// owner's lease to end.
	Wait time.Duration
	// Margin is subtracted from the TTL to set the local deadline; zero
	// means TTL/10. It covers the time a worker needs to stop acting and
	// any difference in clock rates between worker and store. It must be
	// below two thirds of the TTL, so a renewal is due before the deadline.
	Margin time.Duration
	// RetryInterval is the pause between failed renewal attempts (the
	// server or store did not answer, or answered 5xx); zero means TTL/15,
	// at least 100 ms.
	RetryInterval time.Duration
	// OnRetry, if set, is called with each failed renewal attempt that
	// was not a refusal (a refusal ends the session); such a failure is
	// retried every RetryInterval until the local deadline. It runs on the
	// keep-alive goroutine, so it must return quickly: it is for logging.
	OnRetry func(err error)
	// Clock is the session's time source; nil means SystemClock. Tests
	// pass a fake one.
	Clock Clock
}

// Session holds a lease and keeps it alive, in the manner of etcd's
// concurrency.Session and client-go's leader election: it renews every
// TTL/3, retrying failed renewals, until Release is called or the lease is
// lost. It is safe for concurrent use.
//
// Loss. The session decides alone, and conservatively, when it has lost the
// lease: at the first refused renewal (the server answered lease-lost or
// another definite 4xx), or at its local deadline, whichever comes first. The
// local deadline is the time the last confirmed acquire, renew or checkpoint
// request was sent, by the session's own clock, plus the TTL, minus Margin.
// The server counts the TTL from when it handled the request, which is
// later, so the session gives up before the server expires the lease. The
// server's timestamps (acquired_at, expires_at) are never used: the two
// clocks need not agree. Done is then closed, Err says why, and Transport
// refuses fenced requests without sending them.
//
// Limits. A session does not make a worker safe on its own. A worker paused
// past its deadline (GC, VM migration, SIGSTOP) resumes with requests
// already past the session's checks, and a request may reach the storage
// after the lease was lost; client-go's leader election states the same of
// itself. What fences is fencegate's write gate: it refuses any write whose
// Fencing-Token is older than the newest one admitted for the resource.
// Send every write through the gate, with the session's token.
type Session struct {
	client   *Client
	clock    Clock
	resource string
	owner    string
	ttl      time.Duration // the lease's TTL, as the server answered it
	interval time.Duration // between renewals: TTL/3
	margin   time.Duration
	retry    time.Duration
	onRetry  func(error)

	mu       sync.Mutex
	lease    fencing.Lease
	deadline time.Time // local: send time of the last confirmed call + ttl - margin
	err      error     // set once, when the session ends
	done     chan struct{}
	released bool

	stop     chan struct{} // closed by Release: the keep-alive loop returns
	loopDone chan struct{} // closed when the keep-alive loop has returned
}

// NewSession acquires the lease on resource through client, waiting up to
// opts.Wait for another owner's lease to end, and starts keeping it alive.
// It fails as Client.Acquire does (a *ProblemError matching
// fencing.ErrLeaseHeld when the wait ran out), or with ctx's error. ctx
// bounds the acquisition only; the session lives until Release or loss.
//
// When the acquisition took longer than a third of the TTL (the server
// waited for the lease to free), the session acquires once more, as the
// same owner, which extends the lease and keeps its token, so its local
// deadline starts from a recent send time.
func NewSession(ctx context.Context, client *Client, resource string, opts SessionOptions) (*Session, error) {
	if opts.Owner == "" {
		opts.Owner = DefaultOwner()
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.TTL != 0 {
		if err := fencing.ValidateTTL(opts.TTL); err != nil {
			return nil, err
		}
	}
	if opts.Margin < 0 || opts.RetryInterval < 0 {
		return nil, &fencing.ValidationError{Field: "session options", Reason: "must not have a negative Margin or RetryInterval"}
	}
	if opts.TTL != 0 && opts.Margin*3 >= opts.TTL*2 {
		return nil, &fencing.ValidationError{Field: "Margin", Reason: "must be below two thirds of the TTL"}
	}
	clock := opts.Clock
	sent := clock.Now()
	lease, err := client.Acquire(ctx, resource, AcquireOptions{Owner: opts.Owner, TTL: opts.TTL, Wait: opts.Wait})
	if err != nil {
		return nil, err
	}
	if lease.Resource != resource || lease.Owner != opts.Owner || lease.TTL <= 0 {
		return nil, fmt.Errorf("leaseapi: the acquisition of %s by %s: %w", resource, opts.Owner,
			&badAnswerError{status: http.StatusOK, what: fmt.Sprintf("answered with another lease (%s, %s, TTL %v)", lease.Resource, lease.Owner, lease.TTL)})
	}
	ttl := lease.TTL // never longer than asked for: a longer answer is not believed
	if opts.TTL != 0 {
		ttl = min(ttl, opts.TTL)
	}
	s := &Session{
		client:   client,
		clock:    clock,
		resource: resource,
		owner:    opts.Owner,
		ttl:      ttl,
		interval: ttl / 3, // of the TTL the session believes, not of a longer answer
		margin:   opts.Margin,
		retry:    opts.RetryInterval,
		onRetry:  opts.OnRetry,
		done:     make(chan struct{}),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	if s.margin == 0 {
		s.margin = s.ttl / 10
	}
	if s.margin*3 >= s.ttl*2 {
		s.abandon(ctx, lease)
		return nil, &fencing.ValidationError{Field: "Margin", Reason: fmt.Sprintf("must be below two thirds of the TTL (%v)", s.ttl)}
	}
	if s.retry == 0 {
		s.retry = max(s.ttl/15, 100*time.Millisecond)
	}
	if clock.Now().Sub(sent) > s.interval {
		sent = clock.Now()
		again, err := client.Acquire(ctx, resource, AcquireOptions{Owner: opts.Owner, TTL: s.ttl})
		if err == nil {
			err = s.foreign(again, lease.Token)
		}
		if err != nil {
			s.abandon(ctx, lease)
			return nil, fmt.Errorf("leaseapi: confirming a slow acquisition: %w", err)
		}
		lease = again
	}
	s.lease = lease
	s.deadline = sent.Add(s.ttl - s.margin)
	if !clock.Now().Before(s.deadline) {
		s.abandon(ctx, lease)
		return nil, fmt.Errorf("%w: %w: the acquisition took longer than the TTL minus the margin", ErrSessionLost, ErrRenewDeadline)
	}
	go s.keepAlive(sent.Add(s.interval))
	return s, nil
}

// abandon releases a lease the session will not keep, best effort, also
// when ctx has ended (the caller gave up: the lease must not wait out its
// TTL for that), within the TTL.
func (s *Session) abandon(ctx context.Context, l fencing.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.ttl)
	defer cancel()
	_, _ = s.client.Release(ctx, l.Resource, l.Owner, l.Token, false)
}

// foreign returns an error when l, the server's answer to a call about the
// session's lease with token, is another lease: a server, or anything
// between it and here, that answers so is not believed.
func (s *Session) foreign(l fencing.Lease, token fencing.Token) error {
	if l.Resource != s.resource || l.Owner != s.owner || l.Token != token {
		return fmt.Errorf("leaseapi: the lease API answered with another lease (%s, %s, token %d) than the session's (%s, %s, token %d)", l.Resource, l.Owner, l.Token, s.resource, s.owner, token)
	}
	return nil
}

// DefaultOwner returns an owner name unique to this call: the host name,
// the process id and a random suffix.
func DefaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	if len(host) > 100 {
		host = host[:100]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	owner := fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if fencing.ValidateOwner(owner) != nil {
		owner = fmt.Sprintf("worker:%d:%s", os.Getpid(), hex.EncodeToString(b[:]))
	}
	return owner
}

// Resource returns the resource the session holds.
func (s *Session) Resource() string { return s.resource }

// Owner returns the owner name the session acquired as.
func (s *Session) Owner() string { return s.owner }

// Token returns the session's fencing token. It never changes during a
// session; it stays readable after the session ends.
func (s *Session) Token() fencing.Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease.Token
}

// Lease returns the lease as last confirmed by the server. Its times are
// the server's; do not compare them with the local clock.
func (s *Session) Lease() fencing.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease
}

// Done is closed when the session ends: lost, or released.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session holds its lease, and says why it ended
// afterwards: an error matching ErrSessionLost or ErrSessionReleased. It
// checks the local deadline itself, so it reports a loss even before the
// keep-alive loop gets to run (after the process was paused, say).
func (s *Session) Err() error {
	_, err := s.live()
	return err
}

// live returns the lease, or why the session has ended.
func (s *Session) live() (fencing.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil && !s.clock.Now().Before(s.deadline) {
		s.endLocked(s.deadlineError(nil))
	}
	return s.lease, s.err
}

func (s *Session) deadlineError(last error) error {
	if last != nil {
		return fmt.Errorf("%w: %w (last attempt: %w)", ErrSessionLost, ErrRenewDeadline, last)
	}
	return fmt.Errorf("%w: %w", ErrSessionLost, ErrRenewDeadline)
}

// end ends the session with err unless it has already ended.
func (s *Session) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endLocked(err)
}

func (s *Session) endLocked(err error) {
	if s.err == nil {
		s.err = err
		close(s.done)
	}
}

// confirm records a successful acquire, renew or checkpoint sent at sent,
// whose answer is the session's own lease (see foreign), and not at all
// once the session ended. The deadline moves forward by at most the
// session's TTL (an answer with a longer one is not believed). An answer
// with a shorter TTL than the session's says the server now expires the
// lease sooner than the session counted: the deadline moves back to match
// (the send time plus that TTL, less the margin), never forward. It
// returns the session's error when the session had ended.
func (s *Session) confirm(sent time.Time, l fencing.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.lease = l
	d := sent.Add(min(l.TTL, s.ttl) - s.margin)
	if d.After(s.deadline) || l.TTL < s.ttl {
		s.deadline = d
	}
	return nil
}

// refused reports whether err is a definite refusal that retrying cannot
// change: lease-lost, or any other 4xx problem of the lease API but 408
// and 429. A 4xx that is not the API's (a proxy's 404 page while it
// reloads its routes) says nothing of the lease: retried, as a 5xx is,
// until the local deadline.
func refused(err error) bool {
	if errors.Is(err, fencing.ErrLeaseLost) {
		return true
	}
	var pe *ProblemError
	return errors.As(err, &pe) && pe.FromAPI() && pe.Status >= 400 && pe.Status < 500 && pe.Status != 408 && pe.Status != 429
}

// fail ends the session when err is a refusal; it reports whether it did.
func (s *Session) fail(what string, err error) bool {
	if !refused(err) {
		return false
	}
	s.end(fmt.Errorf("%w: %s refused: %w", ErrSessionLost, what, err))
	return true
}

// keepAlive renews the lease from first on, every interval after the send
// time of the last confirmed call, retrying failures every retry, until the
// session ends or Release stops it.
func (s *Session) keepAlive(first time.Time) {
	defer close(s.loopDone)
	next := first
	var last error // the last failed attempt's error, for the loss message
	for {
		s.mu.Lock()
		deadline, ended := s.deadline, s.err != nil
		s.mu.Unlock()
		now := s.clock.Now()
		switch {
		case ended:
			return
		case !now.Before(deadline):
			s.end(s.deadlineError(last))
			return
		case now.Before(next):
			if !sleep(s.clock, min(next.Sub(now), deadline.Sub(now)), s.stop) {
				return
			}
			continue
		}
		sent, lease, err := s.renewBy(deadline)
		switch {
		case err == errStopped:
			return
		case err == nil:
			_ = s.confirm(sent, lease) // an ended session: the loop stops at its next turn
			next, last = sent.Add(s.interval), nil
		case s.fail("renewal", err):
			return
		default:
			next = s.clock.Now().Add(s.retry)
			if err != ErrRenewDeadline {
				last = err
				if s.onRetry != nil {
					s.onRetry(err)
				}
			}
		}
	}
}

// errStopped: Release stopped the keep-alive loop.
var errStopped = errors.New("stopped")

// renewBy sends one renewal and waits for its answer until deadline on the
// session's clock; past it, or on Release, the request is cancelled. A
// renewal cut off by the deadline returns ErrRenewDeadline, one cut off by
// Release errStopped.
func (s *Session) renewBy(deadline time.Time) (sent time.Time, l fencing.Lease, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		l   fencing.Lease
		err error
	}
	ch := make(chan result, 1)
	s.mu.Lock()
	token := s.lease.Token
	s.mu.Unlock()
	sent = s.clock.Now()
	go func() {
		l, err := s.client.Renew(ctx, s.resource, s.owner, token, s.ttl)
		ch <- result{l, err}
	}()
	t := s.clock.NewTimer(deadline.Sub(sent))
	defer t.Stop()
	select {
	case r := <-ch:
		if r.err == nil {
			r.err = s.foreign(r.l, token) // retried, as any failed renewal
		}
		return sent, r.l, r.err
	case <-t.C():
		return sent, fencing.Lease{}, ErrRenewDeadline
	case <-s.stop:
		return sent, fencing.Lease{}, errStopped
	}
}

// Checkpoint saves state (see Client.Checkpoint) for the session's lease,
// which also renews it. An ended session sends nothing and returns Err. A
// refusal by the server ends the session as lost. A session that ended
// while the call was out (its deadline passed) returns its Err too, though
// the server saved the state: the lease is no longer the session's to work
// under, whatever the server holds.
func (s *Session) Checkpoint(ctx context.Context, state any) (fencing.Lease, error) {
	l, err := s.live()
	if err != nil {
		return fencing.Lease{}, err
	}
	sent := s.clock.Now()
	renewed, err := s.client.Checkpoint(ctx, s.resource, s.owner, l.Token, state)
	if err != nil {
		if errors.Is(err, fencing.ErrTooLarge) || errors.Is(err, fencing.ErrInvalid) {
			return fencing.Lease{}, err // the state was refused, not the lease
		}
		s.fail("checkpoint", err)
		return fencing.Lease{}, err
	}
	if err := s.foreign(renewed, l.Token); err != nil {
		return fencing.Lease{}, err
	}
	if err := s.confirm(sent, renewed); err != nil {
		return fencing.Lease{}, fmt.Errorf("%w (the checkpoint was saved after the session ended)", err)
	}
	return renewed, nil
}

// Release ends the session and releases its lease on the server; finished
// tells the next holder the work is done. The session ends first, locally
// (Done is closed, Err matches ErrSessionReleased unless the session was
// already lost, and Transport refuses from then on), then the keep-alive
// loop stops, then the server is asked: so no fenced request leaves after
// Release begins. It returns the server's answer (see Client.Release): a
// lease lost earlier answers an error matching fencing.ErrLeaseLost, or
// false. A second call returns ErrSessionReleased without sending anything.
func (s *Session) Release(ctx context.Context, finished bool) (bool, error) {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return false, ErrSessionReleased
	}
	s.released = true
	s.endLocked(ErrSessionReleased)
	token := s.lease.Token
	s.mu.Unlock()
	close(s.stop)
	<-s.loopDone
	return s.client.Release(ctx, s.resource, s.owner, token, finished)
}
