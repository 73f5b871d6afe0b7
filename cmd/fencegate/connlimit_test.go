package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestConnLimit: with a cap of one connection, a second one is in the
// reserve (health checks served, anything else 503 too-many-connections),
// and one past the reserve is answered 503 at once and closed; a closed
// connection frees its place. Every 503 counts as a refusal (the reserve's
// used not to: fencegate_connections_refused_total stayed 0 through a
// moderate overload).
func TestConnLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limited := newConnLimit(ln, 1, healthReserve, 0)
	srv := &http.Server{
		Handler: overflowHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "served "+r.URL.Path)
		}), isHealthCheck, limited.Counter),
		ConnContext:       connContext,
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(limited) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()

	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	get := func(c net.Conn, path string) (int, string) {
		t.Helper()
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	waitActive := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for limited.Active() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections counted, want %d", limited.Active(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}

	regular := dial()
	if st, body := get(regular, "/v1/x"); st != 200 || body != "served /v1/x" {
		t.Fatalf("within the cap: %d %q", st, body)
	}
	if st, body := get(dial(), "/readyz"); st != 200 || body != "served /readyz" {
		t.Fatalf("health check in the reserve: %d %q", st, body)
	}
	if st, body := get(dial(), "/v1/x"); st != 503 || !strings.Contains(body, "too-many-connections") {
		t.Fatalf("request in the reserve: %d %q", st, body)
	}
	if total, _ := limited.Refused(); total != 1 {
		t.Fatalf("refusals after a request refused in the reserve: %d, want 1", total)
	}
	waitActive(1) // reserve connections are closed after one answer
	var idle []net.Conn
	for range healthReserve {
		idle = append(idle, dial())
	}
	waitActive(1 + healthReserve)
	past := dial()
	_ = past.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, _ := io.ReadAll(past) // answered and closed without a request
	if !strings.HasPrefix(string(answer), "HTTP/1.1 503 ") || !strings.Contains(string(answer), "too-many-connections") {
		t.Fatalf("past the reserve: %q", answer)
	}
	if total, _ := limited.Refused(); total != 2 {
		t.Fatalf("refusals after one past the reserve: %d, want 2", total)
	}
	for _, c := range idle {
		c.Close()
	}
	waitActive(1)
	if st, _ := get(regular, "/v1/y"); st != 200 {
		t.Fatalf("the regular connection after the burst: %d", st)
	}
}
