package access

import (
	"sync"
	"time"
)

// Limiter bounds failed authentications per client address: each failure
// takes one of Burst tokens, which come back one per Every. An address
// with no token left is refused (429) before its credentials are even
// looked at, so guessing runs at most at one try per Every once the burst
// is spent. (The lease API spares connections a token already
// authenticated on, for that token; see leaseapi.ConnContext.) It is safe for concurrent use and keeps at most maxAddrs
// addresses (the fullest are forgotten first).
type Limiter struct {
	burst float64
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	addrs map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// maxAddrs bounds the addresses a Limiter remembers.
const maxAddrs = 1 << 16

// Default limits: 10 failures at once, then one per 6 s (10 a minute).
const (
	DefaultBurst = 10
	DefaultEvery = 6 * time.Second
)

// NewLimiter returns a limiter of burst failures refilled one per every;
// now is its clock (nil: time.Now).
func NewLimiter(burst int, every time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{burst: float64(burst), every: every, now: now, addrs: map[string]*bucket{}}
}

// refill brings b up to now; the caller holds l.mu.
func (l *Limiter) refill(b *bucket, now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(l.burst, b.tokens+float64(d)/float64(l.every))
	}
	b.at = now
}

// Blocked reports whether addr has spent its failures, and if so how long
// until it may try again (at least a second: the Retry-After).
func (l *Limiter) Blocked(addr string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.addrs[addr]
	if !ok {
		return 0, false
	}
	l.refill(b, l.now())
	if b.tokens >= 1 {
		return 0, false
	}
	return l.wait(b), true
}

// Fail records a failed authentication from addr, when addr has one left
// to spend; when it has none (calls that raced spent them since Blocked
// said no), it reports so, as Blocked does, and records nothing. So no
// more failures are answered as such than the allowance, however many
// calls check at once.
func (l *Limiter) Fail(addr string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.addrs[addr]
	if !ok {
		if len(l.addrs) >= maxAddrs {
			l.forget(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.addrs[addr] = b
	}
	l.refill(b, now)
	if b.tokens < 1 {
		return l.wait(b), true
	}
	b.tokens--
	return 0, false
}

// wait is how long until b has a failure to spend, at least a second
// (the Retry-After); the caller holds l.mu.
func (l *Limiter) wait(b *bucket) time.Duration {
	return max(time.Duration((1-b.tokens)*float64(l.every)), time.Second)
}

// forget drops the addresses whose failures are all refilled, or, when
// none is, half of them; the caller holds l.mu.
func (l *Limiter) forget(now time.Time) {
	for a, b := range l.addrs {
		l.refill(b, now)
		if b.tokens >= l.burst {
			delete(l.addrs, a)
		}
	}
	for a := range l.addrs {
		if len(l.addrs) < maxAddrs/2 {
			break
		}
		delete(l.addrs, a)
	}
}
