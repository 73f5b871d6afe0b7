package main

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestLockOutSparesAuthenticatedConnectionThroughTheBinary: with
// FENCEGATE_API_TOKEN, a holder acquires a lease on a keep-alive
// connection; another process on 127.0.0.1 sends bad tokens until the
// address is locked out (429). The holder's renewals on its connection are
// still served; the same token on a new connection is 429 (and that
// connection closed); a bad token on the holder's connection is 429 and
// unlocks nothing.
func TestLockOutSparesAuthenticatedConnectionThroughTheBinary(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_API_TOKEN=s3cret"}, "api")
	addr := p.addr["api"]
	dial := func() net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	req := func(method, path, tok, body string) string {
		return fmt.Sprintf("%s %s HTTP/1.1\r\nHost: fencegate\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			method, path, tok, len(body), body)
	}
	holder := dial()
	st, body := exchange(t, holder, req("POST", "/v1/leases/job:1/acquire", "s3cret", `{"owner":"w1","ttl_seconds":60}`))
	if st != 200 {
		t.Fatalf("acquire: %d %s", st, body)
	}
	m := regexp.MustCompile(`"token":(\d+)`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no token in %s", body)
	}
	renew := req("POST", "/v1/leases/job:1/renew", "s3cret", `{"owner":"w1","token":`+m[1]+`}`)
	// lockOut sends bad tokens, each on a new connection, until one is
	// answered 429 (10 failures at once, then one per 6 s), right before
	// each check that needs the address locked out.
	lockOut := func() {
		t.Helper()
		for range 30 {
			if st, _ := exchange(t, dial(), req("GET", "/v1/leases/job:1", "guess", "")); st == 429 {
				return
			}
		}
		t.Fatal("30 bad tokens from one address were never answered 429")
	}

	lockOut()
	// (a) The holder renews on its connection.
	for i := range 3 {
		if st, body := exchange(t, holder, renew); st != 200 {
			t.Fatalf("holder's renewal %d during the lock-out: %d %s", i, st, body)
		}
	}
	// (b) The holder's token on a new connection: 429, and closed.
	lockOut()
	fresh := dial()
	if st, body := exchange(t, fresh, renew); st != 429 || !strings.Contains(body, "too-many-requests") {
		t.Fatalf("the holder's token on a new connection: %d %s, want 429", st, body)
	}
	_ = fresh.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := fresh.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the new connection was kept open after its 429: %d %v", n, err)
	}
	// (c) A bad token on the holder's connection: 429; the holder's token
	// still 429 on a new connection, still served on the holder's.
	lockOut()
	if st, body := exchange(t, holder, req("GET", "/v1/leases/job:1", "guess", "")); st != 429 {
		t.Fatalf("a bad token on the holder's connection: %d %s, want 429", st, body)
	}
	if st, body := exchange(t, dial(), req("GET", "/v1/leases/job:1", "s3cret", "")); st != 429 {
		t.Fatalf("the holder's token on a new connection after (c): %d %s, want 429", st, body)
	}
	if st, body := exchange(t, holder, renew); st != 200 {
		t.Fatalf("holder's renewal after (c): %d %s", st, body)
	}
}
