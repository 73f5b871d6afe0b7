package leaseapi

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/fencegate/fencegate/fencing/problem"
)

// DefaultBodyMemory is the body budget of a Server whose
// Options.BodyMemory is zero: room for six checkpoints of the default
// largest size at once (their bodies, and then their decoded states),
// within the process's memory goal of 64 MiB of RSS with 1,000
// connections (docs/performance.md). With 16 MiB, fifteen such
// checkpoints decoded at once took the binary to 80 MiB.
const DefaultBodyMemory = 8 << 20

// RetryAfterOverloaded is the Retry-After, in seconds, of an overloaded
// answer: bodies are read within the body timeout, most in far less.
const RetryAfterOverloaded = 1

// bodyBudget bounds the request body bytes the lease API holds at once, in
// all (total) and per client address (perClient; limitKey). A call
// reserves its body's bytes before it reads any (its Content-Length, or
// its body limit when it has none), keeps the bytes it read, and gives
// them back when it is done with what it decoded from them. So however
// many connections or HTTP/2 streams send bodies, and however slowly, the
// bodies held stay within the budget: a call the budget cannot cover is
// answered at once as overloaded (503), none of its body read, nothing
// done. A reservation lasts at most the body timeout for the reading (the
// API server's ReadTimeout cuts a body that stalls), plus, for a
// checkpoint, the store call (the other calls give it back once decoded).
//
// The share per client keeps one address from taking every byte: half the
// total, so that one address cannot keep the others out. (The connection
// caps give a client a quarter; bodies get half because the lease API
// listens on loopback by default, where every worker of the host is one
// address.) Both are at least floor, one body of the largest kind (a
// checkpoint's), so that such a body can always be sent when no other is
// held.
//
// Small bodies keep a part of the budget for themselves (reserve, an
// eighth of it, and clientReserve, an eighth of each client's share): a
// body of more than smallBody bytes (a large checkpoint) may not take it, so calls that declare large bodies and stall, which
// hold their reservations without sending a byte, cannot keep the small
// calls that keep leases alive (acquire, renew, release: a few hundred
// bytes each) out.
//
// What a call holds in memory is about its body's bytes while it reads
// them, and about as much again while it decodes them (a checkpoint's
// state is copied out of the body): about twice the budget in all at
// most, plus the garbage the collector has not yet taken.
type bodyBudget struct {
	total, perClient int64
	// reserve of total and clientReserve of perClient are for bodies of
	// at most smallBody bytes.
	reserve, clientReserve int64
	mu                     sync.Mutex
	used                   int64
	byClient               map[string]int64 // no entry at zero
}

// newBodyBudget returns a budget of total bytes (zero or less:
// DefaultBodyMemory), none of its bounds below floor.
func newBodyBudget(total, floor int64) *bodyBudget {
	if total <= 0 {
		total = DefaultBodyMemory
	}
	total = max(total, floor)
	perClient := min(total, max(total/2, floor))
	return &bodyBudget{total: total, perClient: perClient,
		reserve: min(total/8, total-floor), clientReserve: min(perClient/8, perClient-floor),
		byClient: map[string]int64{}}
}

// smallBody is the largest body that may take the budget's reserve: what
// an acquire, renew or release sends, with room to spare.
const smallBody = 4 << 10

// take reserves n bytes for client, and reports whether the budget had
// them; reserved bytes are given back with give.
func (b *bodyBudget) take(client string, n int64) bool {
	if n <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	room, clientRoom := b.total, b.perClient
	if n > smallBody {
		room, clientRoom = room-b.reserve, clientRoom-b.clientReserve
	}
	if b.used+n > room || b.byClient[client]+n > clientRoom {
		return false
	}
	b.used += n
	b.byClient[client] += n
	return true
}

// give gives back n of client's reserved bytes.
func (b *bodyBudget) give(client string, n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.byClient[client] -= n; b.byClient[client] <= 0 {
		delete(b.byClient, client)
	}
}

// held returns the bytes reserved now, in all.
func (b *bodyBudget) held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// bodyHold is the part of the budget a decoded body still holds; its
// zero value holds nothing.
type bodyHold struct {
	budget *bodyBudget
	client string
	n      int64
}

// release gives the hold back to its budget.
func (h bodyHold) release() {
	if h.budget != nil {
		h.budget.give(h.client, h.n)
	}
}

// growingHold reads a body of unknown length within h, which it makes
// grow from its first reservation to the whole limit once the body goes
// past it; a body the budget cannot cover then fails with errOverBudget.
type growingHold struct {
	r     io.Reader
	h     *bodyHold
	limit int64
	read  int64
}

var errOverBudget = errors.New("leaseapi: the body budget cannot cover this body")

func (g *growingHold) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if g.read >= g.h.n && g.h.n < g.limit {
		// One byte first: a body that ends at its reservation needs no
		// more of the budget.
		n, err := g.r.Read(p[:1])
		if n == 0 {
			return 0, err
		}
		if !g.h.budget.take(g.h.client, g.limit-g.h.n) {
			return 0, errOverBudget
		}
		g.h.n = g.limit
		g.read += int64(n)
		return n, err
	}
	if room := g.h.n - g.read; g.h.n < g.limit && int64(len(p)) > room {
		p = p[:room]
	}
	n, err := g.r.Read(p)
	g.read += int64(n)
	return n, err
}

// overloaded refuses a call whose body the budget cannot cover.
func overloaded() *problem.Error {
	return &problem.Error{Status: http.StatusServiceUnavailable, Code: "overloaded",
		Detail:  "the lease API holds as many request bodies as its memory budget allows; nothing of this request was done, retry later",
		Headers: http.Header{"Retry-After": {strconv.Itoa(RetryAfterOverloaded)}}}
}
