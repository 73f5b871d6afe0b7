package fencingtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/fencegate/fencegate/fencing"
)

// benchResources is how many resources the parallel benchmarks spread over.
const benchResources = 64

// RunBenchmarks measures the store's hot paths as sub-benchmarks, each on a
// freshly opened store:
//
//   - Cycle: Acquire, Renew, Release of one resource (three writes).
//   - AdmitEqual: Admit at the current high-water mark (no raise; a store
//     should not write), with its allocations reported.
//   - AdmitRaise: Admit that raises the mark each time (a write);
//     the tokens are issued beforehand with the timer stopped.
//   - ParallelCycle, ParallelAdmitEqual: the same from GOMAXPROCS goroutines
//     over benchResources resources.
//
// Each reports ops/s beside ns/op. Benchmarks use the real clock and never
// let a lease expire.
func RunBenchmarks(b *testing.B, h Harness) {
	b.Helper()
	b.Run("Cycle", func(b *testing.B) { benchCycle(b, h) })
	b.Run("AdmitEqual", func(b *testing.B) { benchAdmitEqual(b, h) })
	b.Run("AdmitRaise", func(b *testing.B) { benchAdmitRaise(b, h) })
	b.Run("ParallelCycle", func(b *testing.B) { benchParallelCycle(b, h) })
	b.Run("ParallelAdmitEqual", func(b *testing.B) { benchParallelAdmitEqual(b, h) })
}

func openBench(b *testing.B, h Harness) fencing.Store {
	b.Helper()
	inst := h.Open(b)
	if inst.Store == nil {
		b.Fatal("fencingtest: Harness.Open returned no store")
	}
	return inst.Store
}

func reportOps(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
	}
}

// cycle acquires, renews and releases res once as owner.
func cycle(ctx context.Context, st fencing.Store, res, owner string) error {
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: owner, TTL: longTTL})
	if err != nil {
		return fmt.Errorf("Acquire: %w", err)
	}
	if _, err := st.Renew(ctx, fencing.RenewRequest{Resource: res, Owner: owner, Token: l.Token}); err != nil {
		return fmt.Errorf("Renew: %w", err)
	}
	ok, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: owner, Token: l.Token})
	if err != nil {
		return fmt.Errorf("Release: %w", err)
	}
	if !ok {
		return fmt.Errorf("Release of a live lease reported false")
	}
	return nil
}

func benchCycle(b *testing.B, h Harness) {
	st := openBench(b, h)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if err := cycle(ctx, st, "bench:cycle", "bencher"); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportOps(b)
}

// admitted takes a lease on res and admits its token once, so later
// admissions at that token raise nothing.
func admitted(b testing.TB, st fencing.Store, res string) fencing.Token {
	b.Helper()
	ctx := context.Background()
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "bencher", TTL: fencing.MaxTTL})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token}); err != nil {
		b.Fatal(err)
	}
	return l.Token
}

func benchAdmitEqual(b *testing.B, h Harness) {
	st := openBench(b, h)
	ctx := context.Background()
	const res = "bench:admit:equal"
	tok := admitted(b, st, res)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		a, err := st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: tok})
		if err != nil {
			b.Fatal(err)
		}
		if a.Raised {
			b.Fatal("admission at the mark reported Raised")
		}
	}
	b.StopTimer()
	reportOps(b)
}

func benchAdmitRaise(b *testing.B, h Harness) {
	st := openBench(b, h)
	ctx := context.Background()
	const res = "bench:admit:raise"
	// Issue b.N tokens (untimed): each admission below raises the mark.
	// Tokens are collected rather than counted: a store may issue them
	// with gaps (the Valkey store's follow its server clock).
	tokens := make([]fencing.Token, 0, b.N)
	for i := range b.N {
		if i > 0 {
			if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "bencher", Token: tokens[i-1]}); err != nil {
				b.Fatal(err)
			}
		}
		l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "bencher", TTL: fencing.MaxTTL})
		if err != nil {
			b.Fatal(err)
		}
		tokens = append(tokens, l.Token)
	}
	b.ResetTimer()
	for _, tok := range tokens {
		a, err := st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: tok})
		if err != nil {
			b.Fatal(err)
		}
		if !a.Raised {
			b.Fatal("admission above the mark did not report Raised")
		}
	}
	b.StopTimer()
	reportOps(b)
}

func benchParallelCycle(b *testing.B, h Harness) {
	st := openBench(b, h)
	ctx := context.Background()
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// Each goroutine owns its resources, so no call meets a held lease.
		id := next.Add(1)
		owner := fmt.Sprintf("bencher-%d", id)
		for i := 0; pb.Next(); i++ {
			res := fmt.Sprintf("bench:pcycle:%d:%d", id, i%benchResources)
			if err := cycle(ctx, st, res, owner); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportOps(b)
}

func benchParallelAdmitEqual(b *testing.B, h Harness) {
	st := openBench(b, h)
	ctx := context.Background()
	var names [benchResources]string
	var tokens [benchResources]fencing.Token
	for i := range names {
		names[i] = fmt.Sprintf("bench:padmit:%d", i)
		tokens[i] = admitted(b, st, names[i])
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7))
		for pb.Next() {
			i = (i + 1) % benchResources
			if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: names[i], Token: tokens[i]}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportOps(b)
}
