package proxy

import (
	"net/http"
	"net/netip"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/internal/connlimit"
)

// HTTP/2 on the general engine: what a client's streams may make the gate
// hold. Over HTTP/1.1 one connection carries one request at a time, so the
// connection caps (ServerOptions.MaxConns, MaxConnsPerClient) bound the
// requests in flight, and a body the gate has not read waits in the
// kernel's socket buffer. Over HTTP/2 one connection carries up to
// MaxConcurrentStreams requests, each with a handler goroutine, its
// request's state, a body read in full before admission (bufferBody, up
// to Options.BodyBuffer) and whatever DATA has arrived that the gate has
// not read yet, held in the process: without a bound of their own, one
// client's 40 connections of 128 streams, each stalling a 16 KiB body one
// byte short, made the gate hold some 235 MiB. A stalled stream holds its
// body twice (net/http keeps the 16 KiB piece it received in until the
// last byte arrives, the gate's copy is another 16 KiB) and some 46 KiB of
// heap in all.

// The receive windows the gate's HTTP/2 server grants (net/http's default
// is 1 MiB for each): the DATA a client may send ahead of what the gate
// has read, on one stream and on one connection (all its streams
// together). 64 KiB a stream is what upstreamStreamWindow allows an
// upstream's answer; the connection's window lets four streams whose
// bodies wait unread (a large body waits for its admission and its turn
// at the barrier) fill it, after which the connection's other streams
// wait for their DATA until the gate reads some. A stream's upload runs
// at most 64 KiB a round trip.
const (
	h2StreamWindow = 64 << 10
	h2ConnWindow   = 256 << 10
)

// streamCap bounds the HTTP/2 requests (streams) the general engine serves
// at once, over all connections: a quarter of the connection cap in all,
// half of the per-client cap per client (connlimit.Client: an IPv4
// address, an IPv6 /64). A stalled stream holds more memory than an
// HTTP/1.1 connection does, and the total is what bounds the gate's
// memory against many sources: with the defaults (FENCEGATE_MAX_CONNS
// 4096), 1024 in all, some 46 MiB of heap when all stall, and 512 per
// client address. A stream beyond either is answered at once,
// tooManyStreams, before its body is read: nothing is forwarded and the
// store is not asked. HTTP/1.1 requests are not counted (the connection
// caps bound them). A refused stream counts against nothing, so one
// client at its share leaves the other clients their places.
type streamCap struct {
	c *connlimit.Counter // nil: no cap
}

// newStreamCap caps the streams at a quarter of maxConns in all and half
// of perClient per client (either zero or less: no such cap).
func newStreamCap(maxConns, perClient int) streamCap {
	if maxConns <= 0 && perClient <= 0 {
		return streamCap{}
	}
	return streamCap{connlimit.NewCounter(share(maxConns, 4), 0, share(perClient, 2))}
}

// share is n/d, at least 1, for a cap n (zero or less: none).
func share(n, d int) int {
	if n <= 0 {
		return 0
	}
	return max(n/d, 1)
}

// enter counts r if it is an HTTP/2 request, from client, and reports
// whether it is within the caps; a counted request is uncounted with leave
// once answered. An HTTP/1.1 request is not counted: counted is false, ok
// true.
func (s streamCap) enter(r *http.Request) (client netip.Addr, counted, ok bool) {
	if s.c == nil || r.ProtoMajor < 2 {
		return netip.Addr{}, false, true
	}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		client = connlimit.ClientIP(ap.Addr())
	} // else not a TCP peer (a Unix socket): capped in all only
	if _, ok := s.c.Acquire(client); !ok {
		return client, false, false
	}
	return client, true, true
}

// leave uncounts a request enter counted.
func (s streamCap) leave(client netip.Addr) { s.c.Release(client) }

// tooManyStreams is the answer to an HTTP/2 request beyond the stream
// caps: the connection caps' own answer (503 too-many-connections,
// Retry-After: 1), which a client already retries, saying what was full.
func tooManyStreams() *problem.Error {
	p := problem.TooManyConnections()
	p.Detail = "the gate has too many HTTP/2 requests in flight (from this client address, or in all); nothing was forwarded; retry later"
	return p
}
