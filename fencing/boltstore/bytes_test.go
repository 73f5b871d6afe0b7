package boltstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/fencingtest"
)

// TestBytesPerIdleResource measures what an idle resource (acquired,
// written, released) costs the store file, and that after the retention
// the file takes a second generation of as many resources in the space the
// first freed (bbolt reuses freed pages; the file does not shrink).
// docs/stores.md quotes the figures from its log.
func TestBytesPerIdleResource(t *testing.T) {
	if testing.Short() {
		t.Skip("short: thousands of fsynced commits")
	}
	const n, workers = 4000, 8
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "fencegate.db")
	st := open(t, path, boltstore.Options{Clock: clock, Retention: time.Hour, SweepInterval: 24 * time.Hour})
	defer st.Close()
	ctx := context.Background()
	size := func() int64 {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	generation := func(g int) {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += workers {
					res := fmt.Sprintf("job:%d:%08d", g, i)
					l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "worker-1", TTL: time.Minute})
					if err == nil {
						_, err = st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token})
					}
					if err == nil {
						_, err = st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "worker-1", Token: l.Token})
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	before := size()
	generation(1)
	peak := size()
	t.Logf("file store: %.0f bytes per idle resource (%d resources, 14-byte names; file %d bytes before, %d at the peak)",
		float64(peak-before)/n, n, before, peak)
	if per := float64(peak-before) / n; per > 4096 {
		t.Fatalf("%.0f bytes per idle resource, want at most 4 KiB", per)
	}
	clock.Advance(2 * time.Hour)
	if removed, err := st.Sweep(ctx); err != nil || removed != n {
		t.Fatalf("Sweep = %d, %v; want %d removed", removed, err, n)
	}
	generation(2)
	again := size()
	t.Logf("file store: %d bytes after the retention and a second generation of %d resources", again, n)
	if again > peak+peak/10 {
		t.Fatalf("file grew to %d with the second generation, want it within 10%% of the first's peak %d", again, peak)
	}
}
