package barrier

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
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
	if got := b.Registered("r", 1); got != 1 {
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

// TestBarrierIgnoresLowerTokensRegisteredAfterAdmission: a write waits for
// the lower tokens registered before its admission check returned (its
// first Wait), not for those registered later, which the store refuses.
func TestBarrierIgnoresLowerTokensRegisteredAfterAdmission(t *testing.T) {
	b := New()
	before := b.Register("r", 1)
	high := b.Register("r", 2)
	if err := high.Wait(context.Background(), time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a lower token registered before the admission did not block: %v", err)
	}
	after := b.Register("r", 1) // registered once high's snapshot was taken
	before.Leave()
	if err := high.Wait(context.Background(), time.Hour); err != nil {
		t.Fatal(err)
	}
	// A write registered after high's snapshot is not waited for by high,
	// but a new write still waits for it.
	higher := b.Register("r", 3)
	if err := higher.Wait(context.Background(), time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a registered lower token did not block a later write: %v", err)
	}
	after.Leave()
	high.Leave()
	if err := higher.Wait(context.Background(), time.Hour); err != nil {
		t.Fatal(err)
	}
	higher.Leave()
	if n := b.Size(); n != 0 {
		t.Fatalf("%d resources left", n)
	}
}

// TestBarrierDoomedFlood: lower-token writes that keep registering and
// leaving (each leaves only once the next one registered, so one is
// always registered) do not starve a higher-token write. Before the
// snapshot, the higher write waited until its timeout.
func TestBarrierDoomedFlood(t *testing.T) {
	b := New()
	first := b.Register("r", 1)
	high := b.Register("r", 2)
	stop := make(chan struct{})
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		prev := first
		for {
			select {
			case <-stop:
				prev.Leave()
				return
			default:
			}
			next := b.Register("r", 1)
			prev.Leave()
			prev = next
		}
	}()
	err := high.Wait(context.Background(), 30*time.Second)
	close(stop)
	<-flooded
	if err != nil {
		t.Fatalf("the higher write was starved by the flood: %v", err)
	}
	high.Leave()
	if n := b.Size(); n != 0 {
		t.Fatalf("%d resources left", n)
	}
}

// TestBarrierClose: after Close nothing passes Wait, and Close reports
// until when forwarded and held writes may still be applied, leaving out
// writes that were never forwarded.
func TestBarrierClose(t *testing.T) {
	b := New()
	fwd := b.Register("fwd", 1)
	if err := fwd.Wait(context.Background(), time.Hour); err != nil {
		t.Fatal(err)
	}
	held := b.Register("held", 1)
	if err := held.Wait(context.Background(), time.Hour); err != nil {
		t.Fatal(err)
	}
	held.Hold(time.Hour)
	waiting := b.Register("fwd", 2) // admitted, never forwarded
	unadmitted := b.Register("never", 1)
	errc := make(chan error, 1)
	go func() { errc <- waiting.Wait(context.Background(), time.Hour) }()
	waitUntil(t, func() bool { waiting.s.mu.Lock(); defer waiting.s.mu.Unlock(); return waiting.horizon != 0 })
	before := time.Now()
	holds := b.Close(time.Minute)
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("a waiting write after Close: %v", err)
	}
	if len(holds) != 2 {
		t.Fatalf("holds %v, want fwd and held", holds)
	}
	if u := holds["fwd"]; u.Before(before.Add(time.Minute)) || u.After(time.Now().Add(time.Minute)) {
		t.Fatalf("in-flight write held until %v, want now+grace", u)
	}
	if u := holds["held"]; u.Before(before.Add(59*time.Minute)) || u.After(time.Now().Add(time.Hour)) {
		t.Fatalf("held write until %v, want the end of its hold", u)
	}
	if err := b.Register("other", 5).Wait(context.Background(), time.Hour); !errors.Is(err, ErrClosed) {
		t.Fatalf("a write registered after Close: %v", err)
	}
	unadmitted.Leave()
	fwd.Leave()
	waiting.Leave()
}

// TestBarrierRestoredHolds: HoldResource blocks every token on one
// resource, HoldAll every resource, each until it ends.
func TestBarrierRestoredHolds(t *testing.T) {
	b := New()
	b.HoldResource("r", time.Hour)
	if err := b.Register("r", 1).Wait(context.Background(), time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("token 1 passed a restored hold: %v", err)
	}
	if u := b.HeldUntil("r"); time.Until(u) < 59*time.Minute {
		t.Fatalf("HeldUntil %v", u)
	}
	if err := b.Register("s", 1).Wait(context.Background(), time.Hour); err != nil {
		t.Fatalf("another resource was held: %v", err)
	}

	b = New()
	b.HoldAll(50 * time.Millisecond)
	tk := b.Register("any", 7)
	if err := tk.Wait(context.Background(), time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a write passed HoldAll: %v", err)
	}
	if b.HeldUntil("any").IsZero() {
		t.Fatal("HeldUntil does not report HoldAll")
	}
	if err := tk.Wait(context.Background(), time.Hour); err != nil {
		t.Fatal(err) // the hold ends and wakes the waiter
	}
}

// TestBarrierOrdersConcurrentWrites: many goroutines register, pass a
// linearizable admission check (a mutex-guarded high-water mark), wait, and
// "apply" by appending their token to the resource's log. Under -race, each
// log must be non-decreasing: no admitted write overtook a lower one.
func TestBarrierOrdersConcurrentWrites(t *testing.T) {
	b := New()
	var (
		mu      sync.Mutex
		hw      = map[string]fencing.Token{}
		applied = map[string][]fencing.Token{}
		wg      sync.WaitGroup
	)
	admit := func(res string, tk fencing.Token) bool {
		mu.Lock()
		defer mu.Unlock()
		if tk < hw[res] {
			return false
		}
		hw[res] = tk
		return true
	}
	for g := range 64 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 300 {
				res := []string{"a", "b"}[rng.IntN(2)]
				tk := fencing.Token(rng.IntN(40) + 1)
				ticket := b.Register(res, tk)
				if !admit(res, tk) {
					ticket.Leave()
					continue
				}
				if err := ticket.Wait(context.Background(), time.Minute); err != nil {
					ticket.Leave()
					t.Error(err)
					return
				}
				mu.Lock()
				applied[res] = append(applied[res], tk)
				mu.Unlock()
				runtime.Gosched()
				ticket.Leave()
			}
		})
	}
	wg.Wait()
	for res, log := range applied {
		for i := 1; i < len(log); i++ {
			if log[i] < log[i-1] {
				t.Fatalf("resource %s: token %d applied after %d", res, log[i], log[i-1])
			}
		}
	}
	if n := b.Size(); n != 0 {
		t.Fatalf("%d resources left", n)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestTicketPass: Pass answers as Wait would at once, without waiting,
// and a Wait after a false Pass waits for the same writes: those
// registered before the Pass, not a lower token registered after it.
func TestTicketPass(t *testing.T) {
	b := New()
	low := b.Register("r", 1)
	high := b.Register("r", 2)
	if ok, err := low.Pass(); !ok || err != nil {
		t.Fatalf("the lowest token cannot pass: %v %v", ok, err)
	}
	if ok, err := high.Pass(); ok || err != nil {
		t.Fatalf("token 2 passed with token 1 in flight: %v %v", ok, err)
	}
	later := b.Register("r", 1) // after high's Pass: not waited for
	low.Leave()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := high.Wait(ctx, time.Hour); err != nil {
		t.Fatalf("token 2 waited for a write registered after its Pass: %v", err)
	}
	later.Leave()
	high.Leave()
	b.Close(0)
	if ok, err := b.Register("r", 3).Pass(); ok || !errors.Is(err, ErrClosed) {
		t.Fatalf("Pass on a closed barrier: %v %v", ok, err)
	}
}

// BenchmarkBarrier is a write's passage through the barrier (Register,
// Pass, Leave) from as many goroutines as GOMAXPROCS (a gate's event
// loops), on 64 resources taken in turn.
func BenchmarkBarrier(b *testing.B) {
	bar := New()
	var names [64]string
	for i := range names {
		names[i] = fmt.Sprintf("job:%d", i)
	}
	var next atomic.Uint32
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(17))
		for pb.Next() {
			i++
			t := bar.Register(names[i%len(names)], 7)
			if ok, err := t.Pass(); !ok || err != nil {
				b.Errorf("pass: %v %v", ok, err) // not Fatal: this is not the benchmark's goroutine
				return
			}
			t.Leave()
		}
	})
}

// TestBarrierShardsActAsOne: resources in every shard are held by HoldAll,
// closed by Close and counted by Size, as one barrier.
func TestBarrierShardsActAsOne(t *testing.T) {
	b := New()
	var names []string // one resource in each shard
	covered := map[*shard]bool{}
	for i := 0; len(covered) < shardCount; i++ {
		if i > 10000 {
			t.Fatalf("%d of %d shards reached", len(covered), shardCount)
		}
		res := fmt.Sprintf("job:%d", i)
		if s := b.shard(res); !covered[s] {
			covered[s] = true
			names = append(names, res)
		}
	}
	var tickets []*Ticket
	for _, res := range names {
		tickets = append(tickets, b.Register(res, 5))
	}
	if n := b.Size(); n != shardCount {
		t.Fatalf("Size %d, want %d", n, shardCount)
	}
	for _, tk := range tickets {
		tk.Leave()
	}
	b.HoldAll(time.Hour)
	for _, res := range names {
		if !b.InFlight(res) || b.HeldUntil(res).IsZero() {
			t.Fatalf("%s not held by HoldAll", res)
		}
		if ok, err := b.Register(res, 9).Pass(); ok || err != nil {
			t.Fatalf("%s passed HoldAll: %v %v", res, ok, err)
		}
	}
	b.Close(0)
	for _, res := range names {
		if _, err := b.Register(res, 9).Pass(); !errors.Is(err, ErrClosed) {
			t.Fatalf("%s after Close: %v", res, err)
		}
	}
}
