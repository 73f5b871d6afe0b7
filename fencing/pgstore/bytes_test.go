package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/fencingtest"
)

// TestBytesPerIdleResource measures what an idle resource (acquired,
// written, released) costs the database (the resources table with its
// indexes and TOAST, after VACUUM), and that the retention removes every
// one of later generations; it logs the tables' size at each peak.
// docs/stores.md quotes the figures from its log.
func TestBytesPerIdleResource(t *testing.T) {
	if testing.Short() {
		t.Skip("short: thousands of transactions")
	}
	const n, workers = 4000, 8
	s := openWith(t, freshSchema(), time.Second)
	ctx := context.Background()
	size := func() int64 {
		if _, err := s.pool.Exec(ctx, `VACUUM `+s.schema+`.resources`); err != nil {
			t.Fatal(err)
		}
		var b int64
		if err := s.pool.QueryRow(ctx, `SELECT pg_total_relation_size($1) + pg_total_relation_size($2)`,
			s.schema+".resources", s.schema+".checkpoints").Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	generation := func(g int) { fencingtest.IdleResources(t, s, fmt.Sprintf("job:%d:", g), n, workers) }
	before := size()
	generation(1)
	peak := size()
	per := float64(peak-before) / n
	t.Logf("postgres store: %.0f bytes per idle resource (%d resources, 14-byte names; %d bytes before, %d at the peak)", per, n, before, peak)
	if per > 4096 {
		t.Fatalf("%.0f bytes per idle resource, want at most 4 KiB", per)
	}
	// Two more generations, each after the retention removed the one
	// before, every record removed each time.
	sweep := func() {
		time.Sleep(1500 * time.Millisecond) // past the 1 s retention, on the database's clock
		if removed, err := s.Sweep(ctx); err != nil || removed != n {
			t.Fatalf("Sweep = %d, %v; want %d removed", removed, err, n)
		}
	}
	sweep()
	generation(2)
	second := size()
	sweep()
	generation(3)
	third := size()
	// Not asserted: the heap is reused at once, but B-tree pages emptied by
	// the removal of ever-new names are recycled only by later vacuums, so
	// the indexes still grow over these few quick generations
	// (docs/stores.md).
	t.Logf("postgres store: %d bytes at the second generation's peak, %d at the third's", second, third)
}
