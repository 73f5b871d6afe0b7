package boltstore_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/boltstore"
)

// TestHoldsSurviveReopen: the gate's hold record is on disk: a clean stop's
// holds, and an unclean stop (started, never ended), are read back after
// the file is closed and opened again.
func TestHoldsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fencegate.db")
	st := open(t, path, boltstore.Options{})
	if prev, err := st.StartHolds(ctx); err != nil || prev.Unclean || len(prev.Holds) != 0 {
		t.Fatalf("first start: %+v %v", prev, err)
	}
	until := time.Now().Add(time.Minute).Round(0)
	if err := st.EndHolds(ctx, map[string]time.Time{"job:1": until}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	st = open(t, path, boltstore.Options{})
	prev, err := st.StartHolds(ctx)
	if err != nil || prev.Unclean || len(prev.Holds) != 1 || !prev.Holds["job:1"].Equal(until) {
		t.Fatalf("after a clean stop: %+v %v", prev, err)
	}
	st.Close() // no EndHolds: as if killed

	st = open(t, path, boltstore.Options{})
	defer st.Close()
	prev, err = st.StartHolds(ctx)
	if err != nil || !prev.Unclean || len(prev.Holds) != 0 {
		t.Fatalf("after an unclean stop: %+v %v", prev, err)
	}
}
