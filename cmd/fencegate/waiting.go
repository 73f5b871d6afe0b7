package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// waitHeartbeat is how long a waiting acquisition stays silent on stderr,
// at most, before it says it is still waiting.
const waitHeartbeat = 30 * time.Second

// acquireWaiting is the acquisition loop of `lease acquire` and `run`. It
// calls attempt with the wait to ask the API for (zero: answer at once)
// until attempt returns anything but the API's lease-held, or the wait is
// over (the last lease-held is returned), or ctx ends.
//
// The first attempt asks for no wait, so that a held lease is known at
// once: with a wait left, the command then says on stderr that it waits
// (see waitReport) and repeats attempts of at most fencing.MaxWait each,
// the first at once, the next ones after a leaseapi.AcquireBackoff pause.
// No attempt starts whose pause would end past the wait. Each attempt's
// context is bounded by its wait plus acquireGrace.
//
// prefix begins each stderr line ("fencegate", "fencegate run").
func (c *cli) acquireWaiting(ctx context.Context, prefix, resource string, wait waitFlag, attempt func(ctx context.Context, wait time.Duration) error) error {
	began := time.Now()
	deadline := began.Add(wait.d)
	report := newWaitReport(c.stderr, prefix, resource, wait, began)
	defer report.stop()
	var held leaseapi.AcquireBackoff
	for first := true; ; first = false {
		chunk := time.Duration(0)
		if !first {
			chunk = fencing.MaxWait
			if !wait.forever {
				// The API waits in whole seconds: rounded down, so
				// that no attempt outlasts --wait (under a second left,
				// an attempt without a wait).
				chunk = min(max(time.Until(deadline), 0), fencing.MaxWait).Truncate(time.Second)
			}
		}
		actx, cancel := context.WithTimeout(ctx, chunk+acquireGrace)
		sent := time.Now()
		err := attempt(actx, chunk)
		cancel()
		var pe *leaseapi.ProblemError
		if errors.As(err, &pe) && pe.FromAPI() && pe.Code == "lease-held" && ctx.Err() == nil {
			// The first attempt asked for no wait: the next one, which
			// does, follows at once (and the backoff counts only waits).
			var pause time.Duration
			if !first {
				pause = held.Pause(err, chunk, time.Since(sent))
			}
			if wait.forever || pause < time.Until(deadline) {
				report.held(time.Now(), pe)
				sleepCtx(ctx, pause)
				continue // still held: wait again (an interrupted pause ends in the next call)
			}
		}
		if err == nil {
			report.acquired(time.Now())
		}
		return err
	}
}

// waitReport tells on stderr, one line at a time, that an acquisition is
// waiting for another owner's lease, so that a wait is not taken for a
// hang. Stdout is left alone: scripts capture the answer from it.
//
//   - The first lease-held answer starts the wait: a line naming the
//     resource, the holder (the problem's holder member), how long its
//     lease runs unless renewed (the answer's Retry-After: the server's
//     own count, no clocks compared) and how long the command waits.
//   - A later answer writes a line only when the holder changed.
//   - Heartbeat: when every has passed since the last line, a line says
//     the command is still waiting, and since when. It runs beside the
//     call in flight (the API's waits last up to a minute), driven by the
//     readings of ticker's channel.
//   - Acquired after waiting: a line with the time waited. An acquisition
//     that did not wait writes nothing.
//
// Safe for concurrent use.
type waitReport struct {
	w        io.Writer
	prefix   string
	resource string
	wait     waitFlag
	began    time.Time     // when the first attempt was sent
	every    time.Duration // heartbeat interval
	// ticker starts the heartbeat's readings of the clock and returns
	// them with the function that stops them.
	ticker func() (<-chan time.Time, func())

	mu      sync.Mutex
	waiting bool      // a lease-held answer came
	last    time.Time // when a line was last written
	holder  string    // as the last answer named it
	quit    chan struct{}
	done    chan struct{}
}

// newWaitReport returns the report of an acquisition begun at began, with
// a heartbeat every waitHeartbeat read from a one-second ticker.
func newWaitReport(w io.Writer, prefix, resource string, wait waitFlag, began time.Time) *waitReport {
	return &waitReport{w: w, prefix: prefix, resource: resource, wait: wait, began: began, every: waitHeartbeat,
		ticker: func() (<-chan time.Time, func()) {
			t := time.NewTicker(time.Second)
			return t.C, t.Stop
		}}
}

// held reports a lease-held answer pe that came at now.
func (r *waitReport) held(now time.Time, pe *leaseapi.ProblemError) {
	holder, _ := pe.Extra["holder"].(string)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.waiting:
		r.waiting = true
		until := "until acquired"
		if !r.wait.forever {
			until = "up to " + r.wait.String()
		}
		r.line(now, "%s is held by %s%s; waiting %s", r.resource, ownerText(holder), remainingText(pe.RetryAfter), until)
		r.quit, r.done = make(chan struct{}), make(chan struct{})
		ticks, stop := r.ticker()
		go r.beat(ticks, stop, r.quit, r.done)
	case holder != r.holder:
		r.line(now, "%s is now held by %s%s; still waiting, %v so far", r.resource, ownerText(holder), remainingText(pe.RetryAfter), r.sinceBegan(now))
	}
	r.holder = holder
}

// beat writes heartbeats on ticks until quit is closed, then stops the
// ticks and closes done.
func (r *waitReport) beat(ticks <-chan time.Time, stopTicks func(), quit <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	defer stopTicks()
	for {
		select {
		case now := <-ticks:
			r.tick(now)
		case <-quit:
			return
		}
	}
}

// tick writes a heartbeat if every has passed since the last line.
func (r *waitReport) tick(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting && now.Sub(r.last) >= r.every {
		r.line(now, "still waiting for %s (held by %s), %v so far", r.resource, ownerText(r.holder), r.sinceBegan(now))
	}
}

// acquired ends the report of an acquisition that succeeded at now.
func (r *waitReport) acquired(now time.Time) {
	r.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting {
		r.line(now, "acquired %s after %v", r.resource, max(now.Sub(r.began), 0).Round(100*time.Millisecond))
	}
}

// stop ends the heartbeat and waits for it; it may be called more than
// once.
func (r *waitReport) stop() {
	r.mu.Lock()
	quit, done := r.quit, r.done
	r.quit = nil
	r.mu.Unlock()
	if quit != nil {
		close(quit)
		<-done
	}
}

// line writes one line; r.mu is held.
func (r *waitReport) line(now time.Time, format string, args ...any) {
	r.last = now
	fmt.Fprintf(r.w, r.prefix+": "+format+"\n", args...)
}

func (r *waitReport) sinceBegan(now time.Time) time.Duration {
	return max(now.Sub(r.began), 0).Round(time.Second)
}

// ownerText names a holder for a report line.
func ownerText(holder string) string {
	if holder == "" {
		return "another owner"
	}
	return fmt.Sprintf("%q", holder)
}

// remainingText tells how long the holder's lease runs, from a lease-held
// answer's Retry-After (nothing when it gave none).
func remainingText(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprintf(" (its lease ends in %v unless renewed)", d)
}
