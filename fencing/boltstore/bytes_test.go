package boltstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/fencingtest"
)

// TestBytesPerIdleResource measures what an idle resource (acquired,
// written, released) costs the store file, and that after the retention
// the file takes a second generation of as many resources in the space the
// first freed (bbolt reuses freed pages; the file does not shrink).
// docs/stores.md quotes the figures from its log.
//
// Both are judged on the space bbolt has used (DataSize), not on the
// file's size: the file grows in doubling steps, so a second generation
// that needs a few pages more than the first (how the writes fell into
// group commits moves page placement a little, more so on a busy machine)
// can double the file while reusing nearly all the freed space.
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
	generation := func(g int) { fencingtest.IdleResources(t, st, fmt.Sprintf("job:%d:", g), n, workers) }
	before, usedBefore := size(), boltstore.DataSize(st)
	generation(1)
	peak, usedPeak := size(), boltstore.DataSize(st)
	t.Logf("file store: %.0f bytes per idle resource (%d resources, 14-byte names; %d bytes used before, %d at the peak; file %d bytes before, %d at the peak)",
		float64(usedPeak-usedBefore)/n, n, usedBefore, usedPeak, before, peak)
	if per := float64(usedPeak-usedBefore) / n; per > 4096 {
		t.Fatalf("%.0f bytes per idle resource, want at most 4 KiB", per)
	}
	clock.Advance(2 * time.Hour)
	if removed, err := st.Sweep(ctx); err != nil || removed != n {
		t.Fatalf("Sweep = %d, %v; want %d removed", removed, err, n)
	}
	generation(2)
	again, usedAgain := size(), boltstore.DataSize(st)
	t.Logf("file store: %d bytes used (file %d) after the retention and a second generation of %d resources", usedAgain, again, n)
	// Without reuse the second generation would add what the first did;
	// with it, only what fragmentation and the pages still pending free
	// when it ran cost: 0 to 7 % of the first's growth on a quiet machine,
	// up to 11 % beside two CPU burners, and once in CI enough to double
	// the file (at least 14 %). Half is far from both.
	if grew, first := usedAgain-usedPeak, usedPeak-usedBefore; grew > first/2 {
		t.Fatalf("the second generation added %d bytes to the %d used at the first's peak, want at most half the first's %d: freed pages not reused", grew, usedPeak, first)
	}
}
