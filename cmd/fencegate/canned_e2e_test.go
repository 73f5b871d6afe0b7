package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAPIUnreadableRequestsGetProblems: a request net/http cannot read (a
// malformed request target or line, two Content-Length headers, a
// Transfer-Encoding other than chunked, another HTTP version, no Host) is
// answered by net/http itself, before the lease API's handler. Those
// answers used to be net/http's canned text/plain ones; every error body of
// the lease API is application/problem+json, these included, and then a
// readable request on a new connection is served as usual.
func TestAPIUnreadableRequestsGetProblems(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	addr := p.addr["api"]
	for _, c := range []struct {
		name, req string
		status    int
	}{
		{"broken escape", "GET /v1/leases/job%zz HTTP/1.1\r\nHost: api\r\n\r\n", 400},
		{"garbage line", "GARBAGE\r\n\r\n", 400},
		{"two Content-Length", "POST /v1/leases/job:1/acquire HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400},
		{"no Host", "GET /v1/leases/job:1 HTTP/1.1\r\n\r\n", 400},
		{"gzip body", "POST /v1/leases/job:1/acquire HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"HTTP/2.0 line", "GET /livez HTTP/2.0\r\nHost: api\r\n\r\n", 505},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, c.req); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", c.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		conn.Close()
		var pr struct {
			Type, Code string
			Status     int
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" || json.Unmarshal(body, &pr) != nil {
			t.Fatalf("%s: %d with Content-Type %q, body %q; want a problem", c.name, resp.StatusCode, ct, body)
		}
		if resp.StatusCode != c.status || pr.Status != c.status || pr.Code != "invalid-request" || pr.Type != "urn:fencegate:problem:invalid-request" {
			t.Fatalf("%s: %d %s; want %d invalid-request", c.name, resp.StatusCode, body, c.status)
		}
		if !resp.Close {
			t.Fatalf("%s: the connection is kept open after an unreadable request", c.name)
		}
	}
	if code, body, _ := send(t, http.MethodGet, "http://"+addr+"/v1/leases/job:1", ""); code != http.StatusOK || !strings.Contains(body, `"issued_token":0`) {
		t.Fatalf("status after the unreadable requests: %d %s", code, body)
	}
}
