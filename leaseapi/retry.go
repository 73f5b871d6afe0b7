package leaseapi

import (
	"errors"
	"math/rand/v2"
	"time"
)

// Pacing of acquisitions repeated while another owner holds the lease.
const (
	// AcquireRetryFloor is the least pause before an acquisition answered
	// lease-held is sent again.
	AcquireRetryFloor = 100 * time.Millisecond
	// AcquireRetryCap is the longest pause AcquireBackoff grows to, before
	// jitter; a Retry-After is honoured up to it.
	AcquireRetryCap = 5 * time.Second
)

// AcquireBackoff paces an acquisition repeated while the lease API answers
// lease-held: the CLI's --wait loops and Campaign use it. A lease API that
// honours wait_seconds answers lease-held only after waiting as asked, so
// its wait is the pause and the next attempt needs only the floor. One
// that answers at once (an older or misbehaving server, something in
// between) would be hammered by a loop that retried at once: after such an
// early answer the pause grows from AcquireRetryFloor, doubling with each
// early answer in a row up to AcquireRetryCap, at least the answer's
// Retry-After up to that cap (the lease API's Retry-After on lease-held is
// the holder's remaining time, which may be hours: a waiting server would
// answer sooner, when the lease ends). Every pause gets up to half of
// itself again of random jitter, as client-go's wait.Jitter does, so
// waiters do not march in step. The caller keeps the pause within its own
// deadline.
//
// The zero value is ready to use; it is not safe for concurrent use.
type AcquireBackoff struct {
	early int // early answers in a row
}

// Pause returns how long to wait before the next attempt, after one that
// asked the server to wait asked (zero: not at all) and was answered with
// err after took. An answer that took nine tenths of asked or more counts
// as a wait.
func (b *AcquireBackoff) Pause(err error, asked, took time.Duration) time.Duration {
	d := AcquireRetryFloor
	if asked > 0 && took >= asked-asked/10 {
		b.early = 0 // the server waited (clocks may differ a little): that was the pause
	} else {
		d <<= min(b.early, 10)
		b.early++
		var pe *ProblemError
		if errors.As(err, &pe) && pe.RetryAfter > d {
			d = pe.RetryAfter
		}
		d = min(d, AcquireRetryCap)
	}
	return d + rand.N(d/2+1)
}
