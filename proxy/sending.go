package proxy

import (
	"cmp"
	"context"
	"net/http/httptrace"
	"sync"
	"time"
)

// sendingFlight keeps a fenced write's place at the barrier, on the general
// engine, until the upstream has answered the write and the transport has
// written it whole. A streamed body (HTTP/2, gRPC, chunked) can still be
// on its way when the upstream's response headers arrive, as they do on a
// full-duplex call; leaving at the headers would let the next token reach
// the upstream before the last bytes of this one (DESIGN §1.3). The event
// loops send a request whole before they read its answer, and need none of
// this.
//
// Exactly one of the place's Leave or Hold runs, under mu:
//   - answered and written whole, in either order: Leave;
//   - answered, then the transport gave up writing (the client's body
//     failed or was cut off, or the upstream stopped reading it): Hold for
//     the grace, as for any write cut off after it was sent;
//   - the exchange ended (finish) answered but with the transport's report
//     not come: the report decides when it comes (the write may have
//     completed a moment before its report, or be cut off now that the
//     exchange's context ends), or, if none comes within lateReport
//     (late, in tests), Hold;
//   - the exchange ended unanswered and not failed: Hold for the grace;
//   - the exchange failed before an answer: upstreamFailed ends the place
//     itself (failed), Leave or Hold as it judges.
type sendingFlight struct {
	place flight
	grace time.Duration
	late  time.Duration // lateReport, but in tests

	mu       sync.Mutex
	written  bool // the transport reported the request written whole
	answered bool // the upstream's response headers arrived
	ended    bool // the place was left or held
}

// lateReport bounds how long after its exchange ended an answered write's
// place waits for the transport's report. The report comes as soon as the
// write completes or fails, and the exchange's context ends with it, which
// fails a write still in progress; a report later than this is taken as a
// cut-off.
const lateReport = 5 * time.Second

// trace returns ctx with a client trace that reports to s when the
// transport has written the request, whole or not (WroteRequest, which
// net/http's HTTP/1.1 and HTTP/2 transports both call once per attempt).
func (s *sendingFlight) trace(ctx context.Context) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) { s.wrote(info.Err) },
	})
}

// wrote records the transport's report on one attempt to write the request.
func (s *sendingFlight) wrote(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ended:
	case err == nil:
		s.written = true
		if s.answered {
			s.end(false)
		}
	case s.answered:
		s.end(true) // cut off after the answer began: it may be applied in part
	}
	// A failed attempt before any answer: the round trip fails (and
	// upstreamFailed ends the place), or the transport retries a request it
	// never sent, and reports again.
}

// answer records that the upstream's response headers arrived.
func (s *sendingFlight) answer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.answered = true
	if s.written {
		s.end(false)
	}
}

// failed takes the place back for upstreamFailed, which ends it; false if
// it had already ended.
func (s *sendingFlight) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return false
	}
	s.ended = true
	return true
}

// finish runs when the exchange is over. An answered place whose report
// has not come is left to the report (see lateReport); any other place
// still open is held: the upstream may have got it cut off.
func (s *sendingFlight) finish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ended:
	case s.answered:
		time.AfterFunc(cmp.Or(s.late, lateReport), func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.ended {
				s.end(true)
			}
		})
	default:
		s.end(true)
	}
}

// end leaves the place, or holds it for the grace; mu is held.
func (s *sendingFlight) end(hold bool) {
	s.ended = true
	if hold {
		s.place.Hold(s.grace)
	} else {
		s.place.Leave()
	}
}
