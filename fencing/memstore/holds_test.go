package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/memstore"
)

func TestHoldRecord(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.Options{})
	if prev, err := s.StartHolds(ctx); err != nil || prev.Unclean || len(prev.Holds) != 0 {
		t.Fatalf("first start: %+v %v", prev, err)
	}
	if prev, err := s.StartHolds(ctx); err != nil || !prev.Unclean {
		t.Fatalf("start after a start without an end: %+v %v", prev, err)
	}
	until := time.Now().Add(time.Minute)
	if err := s.EndHolds(ctx, map[string]time.Time{"r": until}); err != nil {
		t.Fatal(err)
	}
	if prev, err := s.StartHolds(ctx); err != nil || prev.Unclean || !prev.Holds["r"].Equal(until) {
		t.Fatalf("start after a clean stop: %+v %v", prev, err)
	}
	s.Close()
	if _, err := s.StartHolds(ctx); err == nil {
		t.Fatal("a closed store recorded a start")
	}
}
