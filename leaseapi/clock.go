package leaseapi

import "time"

// Clock is the time source of a Session and of Campaign: when to renew,
// when a lease must be presumed lost, how long to back off. It is a seam for
// tests, which pass a fake clock and move it by hand instead of sleeping; the
// default, SystemClock, is the host's monotonic clock.
//
// Lease arithmetic never uses the server's timestamps: a Session only ever
// compares its own readings of this clock (see SessionOptions.Margin).
type Clock interface {
	// Now returns the current time. Only differences between readings are
	// used, so a monotonic reading is best.
	Now() time.Time
	// NewTimer returns a timer that fires once, d from now (at once when d
	// is zero or negative).
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer made by a Clock.
type Timer interface {
	// C delivers the time once the timer fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// SystemClock is the host's clock: time.Now (with its monotonic reading, so
// wall-clock steps do not move deadlines) and time.NewTimer.
type SystemClock struct{}

var _ Clock = SystemClock{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer.
func (SystemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }

// sleep waits d on clock, or until done is closed; it reports whether the
// whole d passed.
func sleep(clock Clock, d time.Duration, done <-chan struct{}) bool {
	t := clock.NewTimer(d)
	select {
	case <-t.C():
		return true
	case <-done:
		t.Stop()
		return false
	}
}
