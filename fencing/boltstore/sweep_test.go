package boltstore_test

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/fencingtest"
)

var sweepRecords = flag.Int("sweep.records", 100_000, "idle records BenchmarkSweep and BenchmarkSweepContention sweep")

// BenchmarkSweepContention measures what a retention sweep over many idle
// records costs the writers: 16 callers acquire fresh resources for a
// while with no sweep, then while one sweep pass removes -sweep.records
// idle records, then for a while after it, on a real file. It reports the
// rates, the ratio of the first two (slowdown: how many times fewer
// acquisitions a second during the sweep) and the sweep's duration. The
// rate after the sweep shows what the removal left behind (the freed
// pages, which new records reuse; their list is not written on each commit
// but rebuilt at open, NoFreelistSync: with it written, every commit after
// a large sweep wrote all of it). Run it with -benchtime=1x; each
// iteration builds its own file.
func BenchmarkSweepContention(b *testing.B) {
	for range b.N {
		b.StopTimer()
		idle, during, after, took := sweepContention(b, *sweepRecords, 16)
		b.ReportMetric(idle, "acq/s-idle")
		b.ReportMetric(during, "acq/s-sweep")
		b.ReportMetric(after, "acq/s-after")
		b.ReportMetric(idle/during, "slowdown")
		b.ReportMetric(took.Seconds(), "sweep-s")
	}
}

// BenchmarkSweep measures one retention sweep pass alone over
// -sweep.records idle records on a real file, with no writer competing:
// the scans and the removal calls (their re-checks, deletions and
// commits). Each iteration builds its own file, untimed; run it with
// -benchtime=1x or a small count.
func BenchmarkSweep(b *testing.B) {
	n := *sweepRecords
	for range b.N {
		b.StopTimer()
		st := idleStore(b, n)
		ctx := context.Background()
		b.StartTimer()
		start := time.Now()
		removed, err := st.Sweep(ctx)
		took := time.Since(start)
		b.StopTimer()
		if err != nil || removed != n+1 { // and the seed
			b.Fatalf("sweep removed %d of %d idle records: %v", removed, n+1, err)
		}
		b.ReportMetric(float64(removed)/took.Seconds(), "records/s")
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// idleStore opens a store on a new file holding n idle records
// (job:00000000 on) and the released seed they were copied from, its
// fake clock two hours past their retention.
func idleStore(tb testing.TB, n int) *boltstore.Store {
	tb.Helper()
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	st := open(tb, filepath.Join(tb.TempDir(), "fencegate.db"), boltstore.Options{Clock: clock, Retention: time.Hour, SweepInterval: 24 * time.Hour})
	ctx := context.Background()
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "seed", Owner: "o", TTL: time.Minute})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: "seed", Owner: "o", Token: l.Token}); err != nil {
		tb.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("job:%08d", i)
	}
	if err := boltstore.CopyRecord(st, "seed", names); err != nil {
		tb.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	return st
}

// sweepContention fills a store with n idle records, measures the
// acquisitions a second of callers callers without a sweep, during a
// sweep of the n records and for two seconds after it, and returns the
// three rates and the sweep's duration.
func sweepContention(tb testing.TB, n, callers int) (idle, during, after float64, took time.Duration) {
	st := idleStore(tb, n)
	defer st.Close()
	ctx := context.Background()

	var seq atomic.Int64
	// acquire runs callers acquiring fresh resources until stop is closed
	// and returns how many they acquired.
	acquire := func(stop <-chan struct{}) int64 {
		var count atomic.Int64
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					res := fmt.Sprintf("live:%d", seq.Add(1))
					if _, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "o", TTL: time.Hour}); err != nil {
						tb.Error(err)
						return
					}
					count.Add(1)
				}
			}()
		}
		wg.Wait()
		return count.Load()
	}

	stop := make(chan struct{})
	start := time.Now()
	time.AfterFunc(2*time.Second, func() { close(stop) })
	idle = float64(acquire(stop)) / time.Since(start).Seconds()

	stop = make(chan struct{})
	swept := make(chan error, 1)
	start = time.Now()
	go func() {
		removed, err := st.Sweep(ctx)
		took = time.Since(start)
		if err == nil && removed != n+1 { // and the seed
			err = fmt.Errorf("sweep removed %d of %d idle records", removed, n+1)
		}
		close(stop)
		swept <- err
	}()
	during = float64(acquire(stop)) / time.Since(start).Seconds()
	if err := <-swept; err != nil {
		tb.Fatal(err)
	}

	stop = make(chan struct{})
	start = time.Now()
	time.AfterFunc(2*time.Second, func() { close(stop) })
	after = float64(acquire(stop)) / time.Since(start).Seconds()
	return idle, during, after, took
}

// idleResources acquires and releases each of names as owner "old" and
// returns the tokens issued, by name.
func idleResources(t *testing.T, st *boltstore.Store, names ...string) map[string]fencing.Token {
	t.Helper()
	ctx := context.Background()
	tokens := map[string]fencing.Token{}
	for _, res := range names {
		l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "old", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "old", Token: l.Token}); err != nil {
			t.Fatal(err)
		}
		tokens[res] = l.Token
	}
	return tokens
}

// TestSweepKeepsRecordWrittenSinceScan: the sweep scans in a read
// transaction and removes in a later write; a record found idle by the
// scan and written to before the removal (a new lease, an admitted write
// that touches it) is kept, with what was written, and the untouched one
// is removed.
func TestSweepKeepsRecordWrittenSinceScan(t *testing.T) {
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	st := open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{Clock: clock, Retention: time.Hour, SweepInterval: 24 * time.Hour})
	defer st.Close()
	ctx := context.Background()
	old := idleResources(t, st, "job:acquired", "job:admitted", "job:untouched")
	clock.Advance(2 * time.Hour)

	var lease fencing.Lease
	scans := 0
	boltstore.SetSweepHook(st, func(idle []string) {
		scans++
		if scans > 1 || len(idle) != 3 {
			t.Errorf("scan %d found idle %v, want the 3 resources in one scan", scans, idle)
			return
		}
		var err error
		if lease, err = st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:acquired", Owner: "new", TTL: time.Minute}); err != nil {
			t.Error(err)
		}
		if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job:admitted", Token: old["job:admitted"]}); err != nil {
			t.Error(err)
		}
	})
	if removed, err := st.Sweep(ctx); err != nil || removed != 1 {
		t.Fatalf("Sweep = %d, %v; want 1 removed (the untouched record)", removed, err)
	}
	if got, err := st.Status(ctx, "job:acquired"); err != nil || got.Lease == nil || got.Lease.Token != lease.Token || got.Issued != lease.Token {
		t.Fatalf("acquired since the scan: status %+v, %v; want the lease %d kept", got, err, lease.Token)
	}
	if got, err := st.Status(ctx, "job:admitted"); err != nil || got.Issued != old["job:admitted"] {
		t.Fatalf("admitted since the scan: status %+v, %v; want the record kept (issued %d)", got, err, old["job:admitted"])
	}
	if got, err := st.Status(ctx, "job:untouched"); err != nil || got.Issued != 0 || got.Previous != nil {
		t.Fatalf("untouched: status %+v, %v; want it removed (zeros)", got, err)
	}
	// The kept records are idle again a retention later, and go.
	boltstore.SetSweepHook(st, func([]string) {})
	clock.Advance(2 * time.Hour)
	if removed, err := st.Sweep(ctx); err != nil || removed != 2 {
		t.Fatalf("second Sweep = %d, %v; want the 2 kept records removed", removed, err)
	}
}

// TestSweepWithConcurrentAcquisitions: acquisitions of idle resources
// racing a sweep that removes them, on a file counting from one (where
// only the swept mark keeps a fresh record's tokens above the removed
// ones). Whichever comes first, every lease answered is live afterwards
// with its token, and each token is above the one the resource issued
// before.
func TestSweepWithConcurrentAcquisitions(t *testing.T) {
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	st := open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{Clock: clock, CountFromOne: true, Retention: time.Hour, SweepInterval: 24 * time.Hour, SweepBatch: 50})
	defer st.Close()
	ctx := context.Background()
	const n = 200
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("job:%04d", i)
	}
	// Each resource has issued a few tokens, so the removed ones reach
	// above what a fresh count from one would issue first.
	var old map[string]fencing.Token
	for range 2 {
		old = idleResources(t, st, names...)
	}
	clock.Advance(2 * time.Hour)

	var wg sync.WaitGroup
	leases := make([]fencing.Lease, n)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * 7 % n; i < n; i += 5 {
				l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: names[i], Owner: "new", TTL: time.Hour})
				if err != nil {
					t.Error(err)
					return
				}
				leases[i] = l
			}
		}()
	}
	removed, err := st.Sweep(ctx)
	wg.Wait()
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	acquired := 0
	for i, l := range leases {
		if l.Token == 0 {
			continue
		}
		acquired++
		if l.Token <= old[names[i]] {
			t.Errorf("%s: token %d after the sweep, not above %d issued before it", names[i], l.Token, old[names[i]])
		}
		got, err := st.Status(ctx, names[i])
		if err != nil || got.Lease == nil || got.Lease.Token != l.Token {
			t.Errorf("%s: status %+v, %v; want the lease %d live", names[i], got, err, l.Token)
		}
	}
	t.Logf("%d removed, %d acquired during the sweep", removed, acquired)
	if removed > n || removed < n-acquired {
		t.Fatalf("removed %d of %d, %d acquired meanwhile", removed, n, acquired)
	}
}

// TestSweepKeepsRecordNotIdleAfterClockStepBack: a record the scan found
// idle is removed only if it is still idle at the removal's clock
// reading; with the clock stepped back between the scan and the removal
// to before the record's retention ran out, its bytes are unchanged but it
// is kept, as a scan at that reading would have kept it.
func TestSweepKeepsRecordNotIdleAfterClockStepBack(t *testing.T) {
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	st := open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{Clock: clock, Retention: time.Hour, SweepInterval: 24 * time.Hour})
	defer st.Close()
	ctx := context.Background()
	old := idleResources(t, st, "job:a")
	clock.Advance(2 * time.Hour)

	boltstore.SetSweepHook(st, func(idle []string) {
		if len(idle) != 1 {
			t.Errorf("scan found idle %v, want job:a", idle)
		}
		clock.Rewind(90 * time.Minute) // half an hour after the release
	})
	if removed, err := st.Sweep(ctx); err != nil || removed != 0 {
		t.Fatalf("Sweep = %d, %v; want 0 removed (not idle at the removal's clock)", removed, err)
	}
	if got, err := st.Status(ctx, "job:a"); err != nil || got.Issued != old["job:a"] {
		t.Fatalf("status %+v, %v; want the record kept (issued %d)", got, err, old["job:a"])
	}
	boltstore.SetSweepHook(st, func([]string) {})
	clock.Advance(2 * time.Hour)
	if removed, err := st.Sweep(ctx); err != nil || removed != 1 {
		t.Fatalf("second Sweep = %d, %v; want job:a removed", removed, err)
	}
}
