package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// placeLog is a flight that records how its place ended.
type placeLog struct {
	mu    sync.Mutex
	ended []string
}

func (p *placeLog) Wait(context.Context, time.Duration) error { return nil }
func (p *placeLog) Leave()                                    { p.note("leave") }
func (p *placeLog) Hold(time.Duration)                        { p.note("hold") }
func (p *placeLog) note(s string) {
	p.mu.Lock()
	p.ended = append(p.ended, s)
	p.mu.Unlock()
}
func (p *placeLog) outcome() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ended) != 1 {
		return fmt.Sprintf("ended %d times", len(p.ended))
	}
	return p.ended[0]
}

// TestSendingFlightEndsOnce: whatever order the transport's report, the
// answer, the failure and the end of the exchange come in, the place ends
// exactly once: left when the write was answered and written whole, held
// when it may have reached the upstream cut off. In particular a write
// whose report comes just after its exchange ended (the transport's
// goroutine was slower than the answer) is left, not held for the grace.
func TestSendingFlightEndsOnce(t *testing.T) {
	cut := errors.New("cut off")
	for _, c := range []struct {
		name  string
		steps func(s *sendingFlight)
		want  string
	}{
		{"written, answered", func(s *sendingFlight) { s.wrote(nil); s.answer(); s.finish() }, "leave"},
		{"answered, written", func(s *sendingFlight) { s.answer(); s.wrote(nil); s.finish() }, "leave"},
		{"answered, exchange over, then written", func(s *sendingFlight) { s.answer(); s.finish(); s.wrote(nil) }, "leave"},
		{"answered, then cut off", func(s *sendingFlight) { s.answer(); s.wrote(cut); s.finish() }, "hold"},
		{"answered, exchange over, then cut off", func(s *sendingFlight) { s.answer(); s.finish(); s.wrote(cut) }, "hold"},
		{"a failed attempt, retried, answered", func(s *sendingFlight) { s.wrote(cut); s.wrote(nil); s.answer(); s.finish() }, "leave"},
		{"failed before an answer", func(s *sendingFlight) {
			if s.failed() {
				s.place.Leave() // as upstreamFailed does, for a request never sent
			}
			s.wrote(nil)
			s.finish()
		}, "leave"},
		{"exchange over unanswered", func(s *sendingFlight) { s.finish(); s.wrote(nil) }, "hold"},
	} {
		p := &placeLog{}
		s := &sendingFlight{place: p, grace: time.Second, late: time.Hour} // no report is late here
		c.steps(s)
		if got := p.outcome(); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}

	// A report that never comes: the place is held once lateReport passes.
	p := &placeLog{}
	s := &sendingFlight{place: p, grace: time.Second, late: time.Millisecond}
	s.answer()
	s.finish()
	waitFor(t, "the late report's hold", func() bool { return p.outcome() == "hold" })
}
