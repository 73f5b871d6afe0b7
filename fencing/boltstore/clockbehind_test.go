package boltstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
)

// tickingClock moves forward 1 µs at every reading: it never steps back.
type tickingClock struct{ us atomic.Int64 }

func (c *tickingClock) Now() time.Time { return time.UnixMicro(c.us.Add(1)) }

// TestConcurrentFirstAdmissionsAreNoClockStep: many goroutines admitting
// on fresh resources at once (each read of the token clock racing the
// others) on a clock that never steps back count no clock step. Before
// the token clock read the host clock itself, a reading taken before
// another caller's later one was used was counted.
func TestConcurrentFirstAdmissionsAreNoClockStep(t *testing.T) {
	clock := &tickingClock{}
	clock.us.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro())
	st := open(t, filepath.Join(t.TempDir(), "f.db"), boltstore.Options{Clock: clock, Retention: time.Hour, SweepInterval: 24 * time.Hour})
	defer st.Close()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				_, err := st.Admit(context.Background(), fencing.AdmitRequest{Resource: fmt.Sprintf("fresh:%d:%d", g, i), Token: 1})
				if err == nil {
					t.Error("a token for a resource never acquired was admitted")
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := st.RetentionStats().ClockBehind; n != 0 {
		t.Fatalf("ClockBehind = %d after concurrent first admissions on a clock that never stepped back, want 0", n)
	}
}
