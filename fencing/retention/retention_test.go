package retention

import (
	"context"
	"errors"
	"testing"
	"time"
)

// at is a clock that reads t, or runs f first when set.
type at struct {
	t time.Time
	f func()
}

func (a at) Now() time.Time {
	if a.f != nil {
		a.f()
	}
	return a.t
}

func TestClockNeverRunsBackwards(t *testing.T) {
	var st Stats
	c := NewClock(&st)
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if got := c.Read(at{t: t0}); int64(got) != t0.UnixMicro() {
		t.Fatalf("first reading %d, want %d", got, t0.UnixMicro())
	}
	if got := c.Read(at{t: t0.Add(-time.Hour)}); int64(got) != t0.UnixMicro() {
		t.Fatalf("reading behind %d, want the latest %d", got, t0.UnixMicro())
	}
	if st.Snapshot().ClockBehind != 1 {
		t.Fatalf("steps back counted: %+v", st.Snapshot())
	}
	c.Raise(1 << 62)
	if got := c.Read(at{t: t0.Add(time.Hour)}); got != 1<<62 {
		t.Fatalf("reading after Raise %d", got)
	}
}

// TestConcurrentReadingIsNoStep: a reading overtaken by a later one that
// another caller stored first is no step back of the clock: not counted,
// and the later one is returned.
func TestConcurrentReadingIsNoStep(t *testing.T) {
	var st Stats
	c := NewClock(&st)
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	later := t0.Add(time.Millisecond)
	got := c.Read(at{t: t0, f: func() { c.Read(at{t: later}) }})
	if int64(got) != later.UnixMicro() || st.Snapshot().ClockBehind != 0 {
		t.Fatalf("overtaken reading: %d, %+v; want %d and no step counted", got, st.Snapshot(), later.UnixMicro())
	}
}

func TestRunCountsPasses(t *testing.T) {
	var st Stats
	if _, err := Run(context.Background(), func(context.Context) (int, error) { return 3, nil }, &st); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if n, err := Run(context.Background(), func(context.Context) (int, error) { return 1, boom }, &st); n != 1 || !errors.Is(err, boom) {
		t.Fatalf("failing pass: %d, %v", n, err)
	}
	if s := st.Snapshot(); s.Removed != 4 || s.Sweeps != 1 {
		t.Fatalf("stats %+v, want 4 removed in 1 completed sweep", s)
	}
	if Interval(720*time.Hour) != 10*time.Minute || Interval(time.Second) != time.Second || Interval(time.Minute) != 6*time.Second {
		t.Fatal("Interval bounds")
	}
}
