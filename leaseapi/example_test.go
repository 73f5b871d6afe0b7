package leaseapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/leaseapi"
)

// A worker takes a lease, saves progress with a checkpoint, and hands over.
// A second worker is refused while the lease is live, then resumes from the
// checkpoint with a newer fencing token. The server here runs in-process
// over the in-memory store; in production, point NewClient at fencegate's
// API address (FENCEGATE_API_ADDR, default http://127.0.0.1:7070).
func Example() {
	api := leaseapi.NewServer(leaseapi.Options{Store: memstore.New(memstore.Options{})})
	srv := httptest.NewServer(api)
	defer srv.Close()

	ctx := context.Background()
	client := leaseapi.NewClient(srv.URL) // add leaseapi.WithToken(...) when FENCEGATE_API_TOKEN is set

	lease, err := client.Acquire(ctx, "job:42", leaseapi.AcquireOptions{Owner: "worker-a", TTL: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println("worker-a holds job:42 with token", lease.Token)

	// Send writes through the gate with "Fencing-Token: <lease.Token>", and
	// save progress; a checkpoint also renews the lease.
	if _, err := client.Checkpoint(ctx, "job:42", "worker-a", lease.Token, map[string]int{"next_row": 500}); err != nil {
		panic(err)
	}

	_, err = client.Acquire(ctx, "job:42", leaseapi.AcquireOptions{Owner: "worker-b"})
	var held *fencing.LeaseHeldError
	if errors.As(err, &held) {
		fmt.Println("worker-b refused, held by", held.Holder)
	}

	if _, err := client.Release(ctx, "job:42", "worker-a", lease.Token, false); err != nil {
		panic(err)
	}

	next, err := client.Acquire(ctx, "job:42", leaseapi.AcquireOptions{Owner: "worker-b", Wait: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	cp, err := client.ReadCheckpoint(ctx, "job:42")
	if err != nil {
		panic(err)
	}
	fmt.Printf("worker-b holds job:42 with token %d, resumes from %s (previous holder %s)\n", next.Token, cp.State, cp.Previous.Ended)

	// The old holder's token is now stale: renewing it fails.
	_, err = client.Renew(ctx, "job:42", "worker-a", lease.Token, 0)
	fmt.Println("worker-a renew:", errors.Is(err, fencing.ErrLeaseLost))

	// Output:
	// worker-a holds job:42 with token 1
	// worker-b refused, held by worker-a
	// worker-b holds job:42 with token 2, resumes from {"next_row":500} (previous holder released)
	// worker-a renew: true
}
