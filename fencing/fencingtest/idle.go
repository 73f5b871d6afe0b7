package fencingtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// IdleResources leaves n idle resources in st, named prefix followed by
// eight digits (job:1: gives 14-byte names): each acquired, written once
// (an admission that raises its mark) and released, from workers
// goroutines side by side. The first error fails t. The stores' tests of
// bytes per idle resource and of retention measure what these leave.
func IdleResources(t testing.TB, st fencing.Store, prefix string, n, workers int) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				res := fmt.Sprintf("%s%08d", prefix, i)
				l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "worker-1", TTL: time.Minute})
				if err == nil {
					_, err = st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token})
				}
				if err == nil {
					_, err = st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "worker-1", Token: l.Token})
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", res, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
