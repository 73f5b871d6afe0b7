package barrier

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBarrierWaitsForLowerTokensOnly(t *testing.T) {
	b := New()
	low := b.Register("r", 1)
	same := b.Register("r", 1)
	other := b.Register("s", 1) // another resource never blocks
	high := b.Register("r", 2)
	for _, tk := range []*Ticket{low, same, other} {
		if err := tk.Wait(context.Background(), time.Hour); err != nil {
			t.Fatalf("token %d on %s waited: %v", tk.token, tk.resource, err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- high.Wait(context.Background(), time.Hour) }()
	low.Leave()
	low.Leave() // idempotent: must not release "same"
	select {
	case err := <-done:
		t.Fatalf("token 2 passed while an equal-to-1 write was in flight: %v", err)
	default:
	}
	if got := b.res["r"].count[1]; got != 1 {
		t.Fatalf("count for token 1 = %d after one leave", got)
	}
	same.Leave()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	other.Leave()
	high.Leave()
	if n := b.Size(); n != 0 {
		t.Fatalf("%d resources left after every write left", n)
	}
}

func TestBarrierWaitEnds(t *testing.T) {
	b := New()
	low := b.Register("r", 1)
	high := b.Register("r", 5)
	if err := high.Wait(context.Background(), time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := high.Wait(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	high.Leave()
	low.Leave()
	if n := b.Size(); n != 0 {
		t.Fatalf("%d resources left", n)
	}
}

func TestBarrierHoldKeepsClosedThenDrops(t *testing.T) {
	b := New()
	low := b.Register("r", 1)
	low.Hold(30 * time.Millisecond)
	low.Leave() // a later leave does not cut the hold short
	high := b.Register("r", 2)
	if err := high.Wait(context.Background(), time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("the held write did not block: %v", err)
	}
	if err := high.Wait(context.Background(), time.Hour); err != nil {
		t.Fatal(err) // the hold ends and wakes the waiter
	}
	high.Leave()
	if n := b.Size(); n != 0 { // the hold's leave ran before it woke the waiter
		t.Fatalf("%d resources left after the hold ended", n)
	}
}

// TestBarrierMapStaysBounded: many resources used once leave nothing
// behind.
func TestBarrierMapStaysBounded(t *testing.T) {
	b := New()
	for i := range 10000 {
		tk := b.Register(string(rune('a'+i%26))+string(rune(i)), 1)
		if err := tk.Wait(context.Background(), time.Second); err != nil {
			t.Fatal(err)
		}
		tk.Leave()
	}
	if n := b.Size(); n != 0 {
		t.Fatalf("%d resources left", n)
	}
}
