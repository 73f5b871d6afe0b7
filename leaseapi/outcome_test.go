package leaseapi_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
	"github.com/fencegate/fencegate/leaseapi"
)

// TestStoreFaultOutcomeOnValkey: an acquire whose Valkey reply does not
// come back (the server paused with SIGSTOP past the command timeout) is
// answered "unknown", and it did take the lease once the server resumed; an
// acquire on a stopped server is answered "not-done". The Go client maps
// them to ErrAmbiguous and ErrUnavailable.
func TestStoreFaultOutcomeOnValkey(t *testing.T) {
	srv := valkeytest.Start(t)
	store, err := valkeystore.Open(context.Background(), valkeystore.Options{URL: srv.URL(), CommandTimeout: 300 * time.Millisecond, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, newFakeClock(), store, nil)
	client := leaseapi.NewClient(e.srv.URL)

	// Load the acquire script first: a paused server that never saw it
	// would answer NOSCRIPT to the EVALSHA queued while it was stopped.
	wantOK(t, "warm-up acquire", e.post("/v1/leases/warm/acquire", `{"owner":"w"}`))
	srv.Freeze()
	a := e.post("/v1/leases/job:1/acquire", `{"owner":"w","ttl_seconds":60}`)
	wantProblem(t, "acquire on a paused server", a, 503, "store-unavailable")
	if a.str("outcome") != "unknown" {
		t.Fatalf("outcome %q, want unknown: %s", a.str("outcome"), a.raw)
	}
	_, err = client.Acquire(context.Background(), "job:2", leaseapi.AcquireOptions{Owner: "w"})
	if !errors.Is(err, fencing.ErrAmbiguous) || errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("client on an unknown outcome: %v, want ErrAmbiguous only", err)
	}
	srv.Thaw()
	// Whether the paused server ran the acquire when it resumed depends on
	// whether the command had reached it: that is why the answer was
	// "unknown", not "nothing was done". The documented way out works
	// either way: acquire again as the same owner, which takes the lease
	// or extends the one the lost call took (same token).
	var st fencing.Status
	for range 20 {
		if st, err = store.Status(context.Background(), "job:1"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	again := e.post("/v1/leases/job:1/acquire", `{"owner":"w","ttl_seconds":60}`)
	wantOK(t, "acquire again as the same owner", again)
	if st.Lease != nil && (st.Lease.Owner != "w" || again.num("token") != int64(st.Lease.Token)) {
		t.Fatalf("after the server resumed: lease %+v, acquiring again gave %s", st.Lease, again.raw)
	}

	srv.Kill()
	// The first calls may still find the broken connection (sent into a
	// closed socket: unknown); once it is gone, dialing is refused.
	for range 20 {
		if a = e.post("/v1/leases/job:3/acquire", `{"owner":"w"}`); a.str("outcome") == "not-done" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantProblem(t, "acquire on a stopped server", a, 503, "store-unavailable")
	if a.str("outcome") != "not-done" {
		t.Fatalf("outcome %q, want not-done: %s", a.str("outcome"), a.raw)
	}
	for range 20 {
		if _, err = client.Acquire(context.Background(), "job:3", leaseapi.AcquireOptions{Owner: "w"}); !errors.Is(err, fencing.ErrAmbiguous) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous) {
		t.Fatalf("client on a not-done outcome: %v, want ErrUnavailable only", err)
	}
}
