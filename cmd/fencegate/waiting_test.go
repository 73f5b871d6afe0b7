package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/fencegate/fencegate/leaseapi"
)

func heldBy(holder string, remaining time.Duration) *leaseapi.ProblemError {
	pe := &leaseapi.ProblemError{Status: 409, Code: "lease-held", RetryAfter: remaining}
	if holder != "" {
		pe.Extra = map[string]any{"holder": holder}
	}
	return pe
}

// testReport is a waitReport whose heartbeat reads the test's ticks.
func testReport(out *bytes.Buffer, wait waitFlag, began time.Time, ticks chan time.Time, stopped *bool) *waitReport {
	r := newWaitReport(out, "fencegate", "job:42", wait, began)
	r.ticker = func() (<-chan time.Time, func()) { return ticks, func() { *stopped = true } }
	return r
}

// TestWaitReportLines: a waiting acquisition writes its first line, a line
// when the holder changes, a heartbeat only once 30 s passed since the
// last line, and the time waited once acquired; an acquisition that did
// not wait writes nothing. The clock is the test's: ticks are sent by hand.
func TestWaitReportLines(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	var out bytes.Buffer
	var stopped bool
	ticks := make(chan time.Time)
	// tick hands the heartbeat a reading, twice: the second send (a no-op,
	// as nothing is due at the same instant again) returns only once the
	// first was handled, so the lines come in the test's order.
	tick := func(d time.Duration) { ticks <- at(d); ticks <- at(d) }
	r := testReport(&out, waitFlag{d: 5 * time.Minute}, t0, ticks, &stopped)
	r.held(at(200*time.Millisecond), heldBy("worker-a", 9*time.Second))
	tick(10 * time.Second)
	r.held(at(20*time.Second), heldBy("worker-a", 30*time.Second)) // renewed, same holder
	tick(30 * time.Second)                                         // 29.8 s since the first line
	tick(30*time.Second + 200*time.Millisecond)                    // 30 s since the first line
	tick(45 * time.Second)
	r.held(at(50*time.Second), heldBy("worker-b", 28*time.Second))
	tick(70 * time.Second) // 20 s since the change
	tick(80 * time.Second)
	r.held(at(85*time.Second), heldBy("", 0)) // a holder the answer does not name
	r.acquired(at(92*time.Second + 340*time.Millisecond))
	want := `fencegate: job:42 is held by "worker-a" (its lease ends in 9s unless renewed); waiting up to 5m0s
fencegate: still waiting for job:42 (held by "worker-a"), 30s so far
fencegate: job:42 is now held by "worker-b" (its lease ends in 28s unless renewed); still waiting, 50s so far
fencegate: still waiting for job:42 (held by "worker-b"), 1m20s so far
fencegate: job:42 is now held by another owner; still waiting, 1m25s so far
fencegate: acquired job:42 after 1m32.3s
`
	if out.String() != want {
		t.Errorf("report:\n%s\nwant:\n%s", out.String(), want)
	}
	if !stopped {
		t.Error("the heartbeat's ticker was not stopped")
	}
	r.stop() // again: nothing happens

	// --wait forever says until when.
	out.Reset()
	r = testReport(&out, waitFlag{forever: true}, t0, ticks, &stopped)
	r.held(at(time.Second), heldBy("worker-a", time.Hour))
	r.stop() // not acquired (interrupted, or the wait is over): no last line
	if want := `fencegate: job:42 is held by "worker-a" (its lease ends in 1h0m0s unless renewed); waiting until acquired` + "\n"; out.String() != want {
		t.Errorf("forever: %q, want %q", out.String(), want)
	}

	// Acquired at once: nothing, and no heartbeat started.
	out.Reset()
	stopped = false
	r = testReport(&out, waitFlag{d: time.Minute}, t0, ticks, &stopped)
	r.acquired(at(50 * time.Millisecond))
	if out.Len() != 0 || r.quit != nil {
		t.Errorf("acquired at once: %q", out.String())
	}
}
