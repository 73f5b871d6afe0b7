package leaseapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/leaseapi"
)

func TestClientRoundTrip(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		ctx := context.Background()
		c := leaseapi.NewClient(e.srv.URL+"/", leaseapi.WithHTTPClient(e.srv.Client()))
		start := e.clock.Now()

		l, err := c.Acquire(ctx, "job:1", leaseapi.AcquireOptions{Owner: "w1", TTL: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		want := fencing.Lease{Resource: "job:1", Owner: "w1", Token: 1, TTL: 20 * time.Second, AcquiredAt: start, ExpiresAt: start.Add(20 * time.Second)}
		if l != want {
			t.Fatalf("Acquire = %+v, want %+v", l, want)
		}
		e.clock.Advance(time.Second)
		if l, err = c.Renew(ctx, "job:1", "w1", 1, 0); err != nil || !l.ExpiresAt.Equal(start.Add(21*time.Second)) || l.TTL != 20*time.Second {
			t.Fatalf("Renew = %+v, %v", l, err)
		}
		if l, err = c.Renew(ctx, "job:1", "w1", 1, time.Minute); err != nil || l.TTL != time.Minute {
			t.Fatalf("Renew(1m) = %+v, %v", l, err)
		}
		type progress struct {
			Cursor string `json:"cursor"`
			Done   int    `json:"done"`
		}
		if l, err = c.Checkpoint(ctx, "job:1", "w1", 1, progress{Cursor: "k9", Done: 9}); err != nil || l.Token != 1 {
			t.Fatalf("Checkpoint = %+v, %v", l, err)
		}
		cp, err := c.ReadCheckpoint(ctx, "job:1")
		if err != nil {
			t.Fatal(err)
		}
		var p progress
		if err := json.Unmarshal(cp.State, &p); err != nil || p != (progress{"k9", 9}) || cp.Token != 1 || !cp.UpdatedAt.Equal(start.Add(time.Second)) || cp.Previous != nil {
			t.Fatalf("ReadCheckpoint = %+v (%s), %v", cp, cp.State, err)
		}
		st, err := c.Status(ctx, "job:1")
		if err != nil {
			t.Fatal(err)
		}
		if st.Resource != "job:1" || st.Issued != 1 || st.HighWater != 0 || st.Lease == nil || st.Lease.Owner != "w1" ||
			st.Checkpoint == nil || st.Checkpoint.SizeBytes != len(`{"cursor":"k9","done":9}`) || st.Previous != nil {
			t.Fatalf("Status = %+v", st)
		}
		leases, err := c.List(ctx, "job:", 10)
		if err != nil || len(leases) != 1 || leases[0] != *st.Lease {
			t.Fatalf("List = %+v, %v", leases, err)
		}
		if ok, err := c.Release(ctx, "job:1", "w1", 1, true); !ok || err != nil {
			t.Fatalf("Release = %v, %v", ok, err)
		}
		if ok, err := c.Release(ctx, "job:1", "w1", 1, true); ok || err != nil {
			t.Fatalf("repeated Release = %v, %v", ok, err)
		}
		st, err = c.Status(ctx, "job:1")
		if err != nil || st.Lease != nil || st.Previous == nil || *st.Previous != (fencing.Previous{Owner: "w1", Token: 1, Ended: fencing.EndReleased, Finished: true}) {
			t.Fatalf("Status after release = %+v, %v", st, err)
		}
		if leases, err := c.List(ctx, "", 0); err != nil || leases == nil || len(leases) != 0 {
			t.Fatalf("List after release = %#v, %v", leases, err)
		}
		// Checkpoint state given as raw JSON is sent as is.
		l, err = c.Acquire(ctx, "job:1", leaseapi.AcquireOptions{Owner: "w2"})
		if err != nil || l.Token != 2 || l.TTL != fencing.DefaultTTL {
			t.Fatalf("second Acquire = %+v, %v", l, err)
		}
		if _, err := c.Checkpoint(ctx, "job:1", "w2", 2, json.RawMessage(`[1,"two",null]`)); err != nil {
			t.Fatal(err)
		}
		if cp, err := c.ReadCheckpoint(ctx, "job:1"); err != nil || string(cp.State) != `[1,"two",null]` || cp.Token != 2 {
			t.Fatalf("ReadCheckpoint = %s %+v, %v", cp.State, cp, err)
		}
	})
}

func TestClientErrors(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		ctx := context.Background()
		c := leaseapi.NewClient(e.srv.URL)
		if _, err := c.Acquire(ctx, "job:1", leaseapi.AcquireOptions{Owner: "w1"}); err != nil {
			t.Fatal(err)
		}

		_, err := c.Acquire(ctx, "job:1", leaseapi.AcquireOptions{Owner: "w2"})
		var pe *leaseapi.ProblemError
		if !errors.Is(err, fencing.ErrLeaseHeld) || errors.Is(err, fencing.ErrLeaseLost) || !errors.As(err, &pe) {
			t.Fatalf("held: %v", err)
		}
		if pe.Status != 409 || pe.Code != "lease-held" || pe.RetryAfter < time.Second || pe.Extra["holder"] != "w1" {
			t.Fatalf("held problem: %+v", pe)
		}
		var held *fencing.LeaseHeldError
		if !errors.As(err, &held) || held.Holder != "w1" || held.Resource != "job:1" || !held.ExpiresAt.Equal(e.clock.Now().Add(30*time.Second)) {
			t.Fatalf("held as *fencing.LeaseHeldError: %+v", held)
		}

		_, err = c.Renew(ctx, "job:1", "w1", 9, 0)
		if !errors.Is(err, fencing.ErrLeaseLost) || errors.Is(err, fencing.ErrLeaseHeld) {
			t.Fatalf("renew wrong token: %v", err)
		}
		if _, err = c.Release(ctx, "job:1", "w2", 1, false); !errors.Is(err, fencing.ErrLeaseLost) {
			t.Fatalf("release by another owner: %v", err)
		}
		if _, err = c.ReadCheckpoint(ctx, "job:2"); !errors.Is(err, fencing.ErrNoCheckpoint) {
			t.Fatalf("no checkpoint: %v", err)
		}
		if _, err = c.Checkpoint(ctx, "job:1", "w1", 1, make([]byte, testMaxCheckpoint)); !errors.Is(err, fencing.ErrTooLarge) {
			t.Fatalf("oversize state: %v", err)
		}
		// Refused by the server: invalid owner.
		if _, err = c.Acquire(ctx, "job:2", leaseapi.AcquireOptions{Owner: ""}); !errors.Is(err, fencing.ErrInvalid) || !errors.As(err, &pe) || pe.Code != "invalid-request" {
			t.Fatalf("empty owner: %v", err)
		}
		// Refused by the client before sending.
		for name, call := range map[string]func() error{
			"bad resource": func() error { _, err := c.Status(ctx, "a/b"); return err },
			"empty resource": func() error {
				_, err := c.Acquire(ctx, "", leaseapi.AcquireOptions{Owner: "w"})
				return err
			},
			"sub-second TTL": func() error {
				_, err := c.Acquire(ctx, "job:3", leaseapi.AcquireOptions{Owner: "w", TTL: 1500 * time.Millisecond})
				return err
			},
			"wait too long": func() error {
				_, err := c.Acquire(ctx, "job:3", leaseapi.AcquireOptions{Owner: "w", Wait: time.Hour})
				return err
			},
			"renew TTL too long": func() error { _, err := c.Renew(ctx, "job:1", "w1", 1, 48*time.Hour); return err },
		} {
			err := call()
			if !errors.Is(err, fencing.ErrInvalid) || errors.As(err, &pe) {
				t.Errorf("%s: %v, want a local ErrInvalid", name, err)
			}
		}
		if st, err := c.Status(ctx, "job:3"); err != nil || st.Issued != 0 {
			t.Fatalf("a locally refused acquire reached the server: %+v, %v", st, err)
		}

		// Store fault: ErrUnavailable.
		if err := e.store.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err = c.Status(ctx, "job:1"); !errors.Is(err, fencing.ErrUnavailable) || !fencing.IsStoreFault(err) {
			t.Fatalf("closed store: %v", err)
		}
	})
}

func TestClientAuth(t *testing.T) {
	e := newEnv(t, storeKinds[0], func(o *leaseapi.Options) { o.AuthToken = "tok" })
	ctx := context.Background()
	_, err := leaseapi.NewClient(e.srv.URL).Status(ctx, "job:1")
	var pe *leaseapi.ProblemError
	if !errors.As(err, &pe) || pe.Status != 401 || pe.Code != "unauthorized" || !errors.Is(err, leaseapi.ErrUnauthorized) || errors.Is(err, fencing.ErrInvalid) {
		t.Fatalf("no token: %v", err)
	}
	if _, err := leaseapi.NewClient(e.srv.URL, leaseapi.WithToken("tok")).Status(ctx, "job:1"); err != nil {
		t.Fatalf("with token: %v", err)
	}
	// A token that cannot be sent fails the call at once, not as a call
	// that may have taken effect.
	_, err = leaseapi.NewClient(e.srv.URL, leaseapi.WithToken("tok\n")).Acquire(ctx, "job:nl", leaseapi.AcquireOptions{Owner: "a"})
	if err == nil || errors.Is(err, fencing.ErrAmbiguous) || !strings.Contains(err.Error(), "cannot be sent") {
		t.Fatalf("a token with a newline: %v", err)
	}
	if st, err := leaseapi.NewClient(e.srv.URL, leaseapi.WithToken("tok")).Status(ctx, "job:nl"); err != nil || st.Issued != 0 {
		t.Fatalf("after a token that cannot be sent: %+v %v, want nothing done", st, err)
	}
}

func TestClientTransportErrors(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	_, err := leaseapi.NewClient(url).Acquire(context.Background(), "job:1", leaseapi.AcquireOptions{Owner: "w"})
	if !errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous) {
		t.Fatalf("connection refused: %v", err)
	}
	if !errors.Is(err, leaseapi.ErrUnreachable) || !strings.Contains(err.Error(), "lease API unreachable") || strings.Contains(err.Error(), "store unavailable") {
		t.Fatalf("connection refused: %v, want it named as an unreachable lease API, not a store fault", err)
	}

	// The server takes the request and then the caller gives up: the
	// outcome is unknown.
	arrived, release := make(chan struct{}), make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
	}))
	defer hang.Close()
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	_, err = leaseapi.NewClient(hang.URL).Acquire(ctx, "job:1", leaseapi.AcquireOptions{Owner: "w"})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, fencing.ErrAmbiguous) || errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("canceled after sending: %v", err)
	}
	if !strings.Contains(err.Error(), "no answer from the lease API") || strings.Contains(err.Error(), "store") {
		t.Fatalf("canceled after sending: %v, want it named as the API's silence, not the store's", err)
	}

	for _, base := range []string{"::nope", "ftp://host", "localhost:7070", ""} {
		if _, err := leaseapi.NewClient(base).Status(context.Background(), "job:1"); err == nil {
			t.Errorf("base URL %q accepted", base)
		}
	}
}

// TestClientMapsEveryProblem renders each fencing error with the server's
// own problem writer and checks the client turns it back into an error
// that matches the same sentinel and typed error.
func TestClientMapsEveryProblem(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 678e6, time.UTC)
	cases := []struct {
		err      error
		sentinel error
		check    func(error) bool
	}{
		{&fencing.LeaseHeldError{Resource: "r", Holder: "h", ExpiresAt: exp}, fencing.ErrLeaseHeld, func(err error) bool {
			var e *fencing.LeaseHeldError
			return errors.As(err, &e) && e.Holder == "h" && e.ExpiresAt.Equal(exp) && e.Resource == "r"
		}},
		{fmt.Errorf("x: %w", fencing.ErrLeaseLost), fencing.ErrLeaseLost, nil},
		{&fencing.StaleTokenError{Resource: "r", Token: 3, HighWater: 1<<63 + 5}, fencing.ErrStaleToken, func(err error) bool {
			var e *fencing.StaleTokenError
			return errors.As(err, &e) && e.HighWater == 1<<63+5
		}},
		{&fencing.TokenNotIssuedError{Resource: "r", Token: 9, Issued: 7}, fencing.ErrTokenNotIssued, func(err error) bool {
			var e *fencing.TokenNotIssuedError
			return errors.As(err, &e) && e.Issued == 7
		}},
		{fencing.ErrLeaseNotHeld, fencing.ErrLeaseNotHeld, nil},
		{fencing.ErrNoCheckpoint, fencing.ErrNoCheckpoint, nil},
		{&fencing.TooLargeError{Size: 9, Limit: 1}, fencing.ErrTooLarge, nil},
		{&fencing.ValidationError{Field: "owner", Reason: "must not be empty"}, fencing.ErrInvalid, nil},
		{fmt.Errorf("read: %w", fencing.ErrAmbiguous), fencing.ErrAmbiguous, nil},
		{fmt.Errorf("dial: %w", fencing.ErrUnavailable), fencing.ErrUnavailable, nil},
		{fmt.Errorf("%w: lost", fencing.ErrStoreLost), fencing.ErrUnavailable, nil},
	}
	all := []error{fencing.ErrLeaseHeld, fencing.ErrLeaseLost, fencing.ErrStaleToken, fencing.ErrTokenNotIssued, fencing.ErrLeaseNotHeld,
		fencing.ErrNoCheckpoint, fencing.ErrTooLarge, fencing.ErrInvalid, fencing.ErrUnavailable, fencing.ErrAmbiguous}
	for _, c := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { problem.Write(w, r, nil, c.err) }))
		_, err := leaseapi.NewClient(srv.URL).Status(context.Background(), "r")
		srv.Close()
		for _, s := range all {
			if errors.Is(err, s) != (s == c.sentinel) {
				t.Errorf("%v: errors.Is(%v) = %v", c.err, s, !(s == c.sentinel))
			}
		}
		if c.check != nil && !c.check(err) {
			t.Errorf("%v: typed error not filled from %v", c.err, err)
		}
	}

	// A non-problem error page keeps its status and matches no sentinel.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte("<h1>bad gateway</h1>"))
	}))
	defer srv.Close()
	_, err := leaseapi.NewClient(srv.URL).Status(context.Background(), "r")
	var pe *leaseapi.ProblemError
	if !errors.As(err, &pe) || pe.Status != 502 || pe.Code != "" {
		t.Fatalf("html 502: %v", err)
	}
	for _, s := range all {
		if errors.Is(err, s) {
			t.Errorf("html 502 matches %v", s)
		}
	}
}

// TestClientCallPassesAnswersOnUnchanged: Call returns the server's JSON
// as sent, and a refusal keeps its problem document in Body.
func TestClientCallPassesAnswersOnUnchanged(t *testing.T) {
	e := newEnv(t, storeKinds[0], nil)
	ctx := context.Background()
	c := leaseapi.NewClient(e.srv.URL, leaseapi.WithHTTPClient(e.srv.Client()))
	raw, err := c.Call(ctx, http.MethodPost, "/v1/leases/job:1/acquire", nil, map[string]any{"owner": "w1", "ttl_seconds": 5})
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Resource string `json:"resource"`
		Token    int64  `json:"token"`
	}
	if err := json.Unmarshal(raw, &l); err != nil || l.Resource != "job:1" || l.Token != 1 {
		t.Fatalf("Call(acquire) = %s, %v", raw, err)
	}
	_, err = c.Call(ctx, http.MethodPost, "/v1/leases/job:1/acquire", nil, map[string]any{"owner": "w2"})
	var pe *leaseapi.ProblemError
	if !errors.As(err, &pe) || !errors.Is(err, fencing.ErrLeaseHeld) {
		t.Fatalf("Call(acquire) by another owner: %v", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(pe.Body, &doc); err != nil || doc["code"] != "lease-held" || doc["holder"] != "w1" {
		t.Fatalf("problem Body = %s, %v", pe.Body, err)
	}
	raw, err = c.Call(ctx, http.MethodGet, "/v1/leases", url.Values{"prefix": {"job:"}}, nil)
	if err != nil || !json.Valid(raw) || !strings.Contains(string(raw), `"job:1"`) {
		t.Fatalf("Call(list) = %s, %v", raw, err)
	}
}

// Pages: next_cursor on full pages, null on the last; the client's
// ListPage, Leases and ListAll follow it to every lease exactly once.
func TestClientPages(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		ctx := context.Background()
		c := leaseapi.NewClient(e.srv.URL, leaseapi.WithHTTPClient(e.srv.Client()))
		var want []fencing.Lease
		for i := range 25 {
			l, err := c.Acquire(ctx, fmt.Sprintf("page:%02d", i), leaseapi.AcquireOptions{Owner: "w"})
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, l)
		}
		for _, res := range []string{"pagd", "pagf"} {
			if _, err := c.Acquire(ctx, res, leaseapi.AcquireOptions{Owner: "w"}); err != nil {
				t.Fatal(err)
			}
		}
		// By hand: 10, 10, 5 (the last page, next_cursor null).
		var got []fencing.Lease
		cursor := ""
		for i, n := range []int{10, 10, 5} {
			p, err := c.ListPage(ctx, "page:", 10, cursor)
			if err != nil || len(p.Leases) != n || (p.NextCursor == "") != (i == 2) {
				t.Fatalf("page %d: %d leases, next %q, %v; want %d", i, len(p.Leases), p.NextCursor, err, n)
			}
			got = append(got, p.Leases...)
			cursor = p.NextCursor
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("pages by hand = %v, want %v", got, want)
		}
		for _, size := range []int{0, 1, 7, 25} {
			all, err := c.ListAll(ctx, "page:", size)
			if err != nil || fmt.Sprint(all) != fmt.Sprint(want) {
				t.Fatalf("ListAll(page size %d) = %v, %v; want %v", size, all, err, want)
			}
		}
		// A page exactly as long as the limit has a cursor; the next is
		// empty, and the last.
		p, err := c.ListPage(ctx, "page:", 25, "")
		if err != nil || len(p.Leases) != 25 || p.NextCursor == "" {
			t.Fatalf("a full page of 25: %d, %q, %v", len(p.Leases), p.NextCursor, err)
		}
		if p, err = c.ListPage(ctx, "page:", 25, p.NextCursor); err != nil || len(p.Leases) != 0 || p.NextCursor != "" {
			t.Fatalf("the page after a full last one: %+v, %v", p, err)
		}
		// The answer says null, not nothing.
		a := e.get("/v1/leases?prefix=page:&limit=30")
		if v, ok := a.body["next_cursor"]; !ok || v != nil {
			t.Fatalf("last page: next_cursor %v (present %v), want null", v, ok)
		}
		// Stopping early stops reading.
		n := 0
		for l, err := range c.Leases(ctx, "", 2) {
			if err != nil || l.Resource == "" {
				t.Fatal(l, err)
			}
			if n++; n == 3 {
				break
			}
		}
		if n != 3 {
			t.Fatalf("the iteration yielded %d leases, want 3 before the break", n)
		}
		// A cursor the API never gave is refused.
		if _, err := c.ListPage(ctx, "", 0, "not a cursor"); !errors.Is(err, fencing.ErrInvalid) {
			t.Fatalf("ListPage with a forged cursor: %v, want ErrInvalid", err)
		}
		for _, err := range c.Leases(ctx, "bad prefix", 0) {
			if !errors.Is(err, fencing.ErrInvalid) {
				t.Fatalf("Leases with a bad prefix: %v, want ErrInvalid", err)
			}
		}
	})
}
