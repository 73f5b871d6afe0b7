package proxy

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBarrierWaitsForLowerTokensOnly(t *testing.T) {
	b := newBarrier()
	low := b.register("r", 1)
	same := b.register("r", 1)
	other := b.register("s", 1) // another resource never blocks
	high := b.register("r", 2)
	for _, tk := range []*ticket{low, same, other} {
		if err := tk.wait(context.Background(), time.Hour); err != nil {
			t.Fatalf("token %d on %s waited: %v", tk.token, tk.resource, err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- high.wait(context.Background(), time.Hour) }()
	low.leave()
	low.leave() // idempotent: must not release "same"
	select {
	case err := <-done:
		t.Fatalf("token 2 passed while an equal-to-1 write was in flight: %v", err)
	default:
	}
	if got := b.res["r"].count[1]; got != 1 {
		t.Fatalf("count for token 1 = %d after one leave", got)
	}
	same.leave()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	other.leave()
	high.leave()
	if n := b.size(); n != 0 {
		t.Fatalf("%d resources left after every write left", n)
	}
}

func TestBarrierWaitEnds(t *testing.T) {
	b := newBarrier()
	low := b.register("r", 1)
	high := b.register("r", 5)
	if err := high.wait(context.Background(), time.Millisecond); !errors.Is(err, errBarrierTimeout) {
		t.Fatalf("timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := high.wait(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	high.leave()
	low.leave()
	if n := b.size(); n != 0 {
		t.Fatalf("%d resources left", n)
	}
}

func TestBarrierHoldKeepsClosedThenDrops(t *testing.T) {
	b := newBarrier()
	low := b.register("r", 1)
	low.hold(30 * time.Millisecond)
	low.leave() // a later leave does not cut the hold short
	high := b.register("r", 2)
	if err := high.wait(context.Background(), time.Millisecond); !errors.Is(err, errBarrierTimeout) {
		t.Fatalf("the held write did not block: %v", err)
	}
	if err := high.wait(context.Background(), time.Hour); err != nil {
		t.Fatal(err) // the hold ends and wakes the waiter
	}
	high.leave()
	waitFor(t, "the map to empty", func() bool { return b.size() == 0 })
}

// TestBarrierMapStaysBounded: many resources used once leave nothing
// behind.
func TestBarrierMapStaysBounded(t *testing.T) {
	b := newBarrier()
	for i := range 10000 {
		tk := b.register(string(rune('a'+i%26))+string(rune(i)), 1)
		if err := tk.wait(context.Background(), time.Second); err != nil {
			t.Fatal(err)
		}
		tk.leave()
	}
	if n := b.size(); n != 0 {
		t.Fatalf("%d resources left", n)
	}
}
