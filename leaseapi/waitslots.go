package leaseapi

import "sync"

// waitSlots bounds the acquisitions that wait at once (wait_seconds), per
// client address (limitKey) and in all. Over HTTP/1.1 the connection caps
// bound them already, one a connection; over HTTP/2 a connection carries
// up to MaxConcurrentStreams streams, each of which could hold a waiting
// acquisition (a goroutine and some 40 KiB for up to a minute), so the
// caps alone would let one client hold hundreds of thousands. An
// acquisition that finds no slot does not wait: it is answered as one
// without a wait is, at once (a lease-held refusal, its wait cut short).
type waitSlots struct {
	perClient, total int // 0: no bound
	mu               sync.Mutex
	byClient         map[string]int
	n                int
}

// take takes a slot for client, and reports whether there was one; a
// taken slot is given back with give.
func (w *waitSlots) take(client string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.total > 0 && w.n >= w.total || w.perClient > 0 && w.byClient[client] >= w.perClient {
		return false
	}
	if w.byClient == nil {
		w.byClient = map[string]int{}
	}
	w.n++
	w.byClient[client]++
	return true
}

// give gives back client's slot.
func (w *waitSlots) give(client string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n--
	if w.byClient[client]--; w.byClient[client] <= 0 {
		delete(w.byClient, client)
	}
}
