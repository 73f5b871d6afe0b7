package canned_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/canned"
)

// A real net/http server behind a Listener: the requests it cannot read get
// problem answers with the listener's versions detail for a 505, and a
// handler's answer, even one shaped like a canned answer but for its Date,
// passes through byte for byte.
func TestRealServerAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const versions = "this server speaks HTTP/1.x"
	srv := &http.Server{MaxHeaderBytes: 1024, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "the handler's own")
	})}
	go func() { _ = srv.Serve(canned.Listener{Listener: ln, Versions: versions}) }()
	t.Cleanup(func() { _ = srv.Close() })

	ask := func(req string) (*http.Response, []byte) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, b
	}
	for _, c := range []struct {
		req, detail string
		status      int
	}{
		{"GET /a%zz HTTP/1.1\r\nHost: h\r\n\r\n", "could not be parsed", 400},
		{"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "could not be parsed", 400},
		{"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", "Transfer-Encoding", 501},
		{"GET / HTTP/2.0\r\nHost: h\r\n\r\n", versions, 505},
		{"GET / HTTP/1.1\r\nHost: h\r\nX: " + strings.Repeat("x", 16<<10) + "\r\n\r\n", "too large", 431},
	} {
		resp, body := ask(c.req)
		var p struct {
			Code, Detail string
			Status       int
		}
		if resp.Header.Get("Content-Type") != "application/problem+json" || json.Unmarshal(body, &p) != nil {
			t.Fatalf("%.40q: %d %q %s; want a problem", c.req, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		if resp.StatusCode != c.status || p.Status != c.status || p.Code != "invalid-request" || !strings.Contains(p.Detail, c.detail) || !resp.Close {
			t.Fatalf("%.40q: %d close=%v %s; want %d invalid-request naming %q, connection closed", c.req, resp.StatusCode, resp.Close, body, c.status, c.detail)
		}
	}
	resp, body := ask("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	if resp.StatusCode != http.StatusBadRequest || !bytes.Equal(body, []byte("the handler's own")) || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("the handler's answer was rewritten: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

// Problem rewrites only net/http's canned form: the status line followed at
// once by exactly its two header fields and the blank line, a 4xx or 5xx.
func TestProblemOnlyTheCannedForm(t *testing.T) {
	const hdrs = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
	for _, p := range []string{
		"HTTP/1.1 200 OK" + hdrs + "fine",
		"HTTP/1.1 302 Found" + hdrs,
		"HTTP/1.0 400 Bad Request" + hdrs + "400 Bad Request",
		"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nDate: x\r\n\r\n",
		"HTTP/1.1 400 Bad Request\r\nX-Request-Id: r1" + hdrs,
		"HTTP/1.1 4x0 Bad Request" + hdrs,
		"a body that mentions HTTP/1.1 400 Bad Request" + hdrs,
	} {
		if q, ok := canned.Problem([]byte(p), "v"); ok {
			t.Fatalf("%q rewritten to %q", p, q)
		}
	}
	q, ok := canned.Problem([]byte("HTTP/1.1 400 Bad Request: missing required Host header"+hdrs+"400 Bad Request: missing required Host header"), "v")
	if !ok || !bytes.HasPrefix(q, []byte("HTTP/1.1 400 Bad Request\r\nContent-Type: application/problem+json\r\n")) || !bytes.Contains(q, []byte("missing required Host header")) {
		t.Fatalf("canned 400 not rewritten as a problem: %q", q)
	}
}
