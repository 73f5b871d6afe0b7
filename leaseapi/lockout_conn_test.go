package leaseapi_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/leaseapi"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// A process sharing a holder's address (every worker of a sidecar connects
// from 127.0.0.1) floods bad tokens until the address is locked out. The
// holder, whose token authenticated on its keep-alive connection before
// the flood, keeps renewing on that connection, over HTTP/1.1 and over
// HTTP/2 (concurrent streams too); the same token on a new connection is
// 429 (and that connection closed), and so is any other credential on the
// holder's connection, which unlocks nothing.
func TestLockOutSparesConnectionsAlreadyAuthenticated(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		name := "http1"
		if h2 {
			name = "http2"
		}
		t.Run(name, func(t *testing.T) { testLockOutSparesConnections(t, h2) })
	}
}

func testLockOutSparesConnections(t *testing.T, h2 bool) {
	p, err := access.Parse([]byte(accessDoc))
	if err != nil {
		t.Fatal(err)
	}
	api := leaseapi.NewServer(leaseapi.Options{Store: memstore.New(memstore.Options{}), Access: access.Static(p)})
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	leaseapi.SetLimiter(api, access.NewLimiter(3, time.Hour, func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	srv := httptest.NewUnstartedServer(api)
	srv.Config.ConnContext = leaseapi.ConnContext
	if h2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	defer srv.Close()
	ctx := context.Background()

	// newConn is an http.Client that opens at most one connection, and
	// counts the connections it dialled.
	newConn := func() (*http.Client, *atomic.Int32) {
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.MaxConnsPerHost = 1
		var dials atomic.Int32
		dial := tr.DialContext
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dial(ctx, network, addr)
		}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}, &dials
	}
	// call sends a status read with tok on hc: its status, and the
	// protocol.
	call := func(hc *http.Client, tok string) (int, int) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/v1/leases/job:a:1", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("status read with %q: %v", tok, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == 429 && (resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "too-many-requests")) {
			t.Fatalf("a 429 without Retry-After or problem: %v %s", resp.Header, b)
		}
		return resp.StatusCode, resp.ProtoMajor
	}
	// reopens says whether the next call on hc needs a new connection:
	// whether the server closed hc's (HTTP/1.1 Connection: close, HTTP/2
	// GOAWAY).
	reopens := func(hc *http.Client, dials *atomic.Int32) bool {
		t.Helper()
		before := dials.Load()
		call(hc, "guess")
		return dials.Load() > before
	}

	holderHC, holderDials := newConn()
	holder := leaseapi.NewClient(srv.URL, leaseapi.WithHTTPClient(holderHC), leaseapi.WithToken("tok-a"))
	lease, err := holder.Acquire(ctx, "job:a:1", leaseapi.AcquireOptions{Owner: "pool-a/w1", TTL: 30 * time.Second})
	if err != nil {
		t.Fatalf("holder acquires: %v", err)
	}
	if st, proto := call(holderHC, "tok-a"); st != 200 || proto != map[bool]int{false: 1, true: 2}[h2] {
		t.Fatalf("holder's status read: %d over HTTP/%d", st, proto)
	}

	// The flood: bad tokens, each on a new connection, until 429.
	fails := 0
	var guesser *http.Client
	var guesserDials *atomic.Int32
	for i := 0; ; i++ {
		hc, dials := newConn()
		st, _ := call(hc, "guess")
		if st == 429 {
			guesser, guesserDials = hc, dials
			break
		}
		if st != 401 || i > 10 {
			t.Fatalf("guess %d: %d, want 401 within the burst of 3, then 429", i, st)
		}
		fails++
	}
	if fails != 3 {
		t.Fatalf("%d guesses told 401, want the burst of 3", fails)
	}

	// (a) The holder renews on its connection, again and again, and
	// (HTTP/2) with concurrent streams.
	for i := range 3 {
		if _, err := holder.Renew(ctx, "job:a:1", "pool-a/w1", lease.Token, 0); err != nil {
			t.Fatalf("holder's renewal %d during the lock-out: %v", i, err)
		}
	}
	if h2 {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := holder.Renew(ctx, "job:a:1", "pool-a/w1", lease.Token, 0)
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("holder's concurrent renewal during the lock-out: %v", err)
			}
		}
	}

	if !reopens(guesser, guesserDials) {
		t.Fatal("a locked-out guesser's connection was kept open")
	}

	// (b) The holder's token on a new connection: 429, closed.
	hc, dials := newConn()
	if st, _ := call(hc, "tok-a"); st != 429 || !reopens(hc, dials) {
		t.Fatalf("the holder's token on a new connection: %d, want 429 and the connection closed", st)
	}
	var pe *leaseapi.ProblemError
	fresh, _ := newConn()
	if _, err := leaseapi.NewClient(srv.URL, leaseapi.WithHTTPClient(fresh), leaseapi.WithToken("tok-a")).Renew(ctx, "job:a:1", "pool-a/w1", lease.Token, 0); !errors.As(err, &pe) || pe.Status != 429 {
		t.Fatalf("a renewal through a new client: %v, want 429", err)
	}

	// (c) A bad token, or another client's good one, on the holder's
	// connection: 429, the connection kept; nothing is unlocked.
	for _, tok := range []string{"guess", "tok-b", "tok-a-"} {
		if st, _ := call(holderHC, tok); st != 429 {
			t.Fatalf("%q on the holder's connection: %d, want 429", tok, st)
		}
	}
	if st, _ := call(hc, "tok-a"); st != 429 {
		t.Fatalf("the holder's token on a new connection after (c): %d, want 429", st)
	}
	if _, err := holder.Renew(ctx, "job:a:1", "pool-a/w1", lease.Token, 0); err != nil {
		t.Fatalf("holder's renewal after (c): %v", err)
	}
	if n := holderDials.Load(); n != 1 {
		t.Fatalf("the holder dialled %d connections, want its one kept throughout", n)
	}

	// Once the failures are refilled, a new connection is served.
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	hc, _ = newConn()
	if st, _ := call(hc, "tok-a"); st != 200 {
		t.Fatalf("after the refill, a new connection: %d, want 200", st)
	}
}
