// Package canned turns the plain-text answers net/http writes itself into
// application/problem+json ones.
//
// net/http answers a request it cannot read (a malformed head or request
// target, one too large, an unsupported Transfer-Encoding or protocol
// version) itself, before any handler sees it, with a canned plain-text
// answer written straight to the connection and the connection closed. A
// Conn rewrites those into problem answers (400 invalid-request, 431, 501,
// 505, Connection: close), so every refusal a client gets from a fencegate
// listener is application/problem+json. On a TLS listener the canned
// answer stays as net/http writes it: the connection under TLS carries
// ciphertext, and wrapping the *tls.Conn would hide it from net/http.
//
// Only the canned form is rewritten: its header block is exactly
// cannedHeaders right after the status line, which no handler's answer has
// (the handlers of fencegate's listeners write X-Request-Id, which sorts
// before the fields net/http adds).
package canned

import (
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/fencing/problem"
)

const cannedHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// Listener wraps each accepted connection in a Conn with its Versions.
type Listener struct {
	net.Listener
	// Versions is the detail of the 505 answer to a request line of a
	// version the server does not speak, saying which ones it does.
	Versions string
}

// Accept accepts a connection and wraps it.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Conn{Conn: c, Versions: l.Versions}, nil
}

// Conn rewrites net/http's canned answers written to it.
type Conn struct {
	net.Conn
	Versions string // as Listener.Versions
}

// Write writes p, or the problem answer for p if p is a canned answer
// (then it reports len(p) written).
func (c Conn) Write(p []byte) (int, error) {
	if q, ok := Problem(p, c.Versions); ok {
		if _, err := c.Conn.Write(q); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// Unwrap is the connection under a Conn, or c itself.
func Unwrap(c net.Conn) net.Conn {
	if p, ok := c.(Conn); ok {
		return p.Conn
	}
	return c
}

// Problem is the problem answer for canned answer p, if p is one; versions
// is the detail of a 505.
func Problem(p []byte, versions string) ([]byte, bool) {
	const prefix = "HTTP/1.1 "
	if !bytes.HasPrefix(p, []byte(prefix)) {
		return nil, false
	}
	// The header block must follow the status line at once: look at the
	// first line only, not through a response's whole buffer.
	end := bytes.IndexByte(p, '\r')
	if end < 0 || !bytes.HasPrefix(p[end:], []byte(cannedHeaders)) {
		return nil, false
	}
	line, rest := p[len(prefix):end], p[end+len(cannedHeaders):]
	if bytes.IndexByte(line, '\n') >= 0 || len(line) < 4 || line[3] != ' ' {
		return nil, false
	}
	status, err := strconv.Atoi(string(line[:3]))
	if err != nil || status < 400 || status > 599 {
		return nil, false
	}
	reason := strings.TrimPrefix(string(rest), string(line[:3])+" ")
	var pr *problem.Error
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		pr = problem.New(status, "invalid-request", "the request's line and headers are too large")
	case http.StatusNotImplemented:
		pr = problem.New(status, "invalid-request", "the request's Transfer-Encoding is not supported: only chunked is")
	case http.StatusHTTPVersionNotSupported:
		pr = problem.New(status, "invalid-request", versions)
	default:
		pr = problem.New(status, "invalid-request", "the request could not be parsed as HTTP/1.1: "+truncate(reason))
	}
	body := pr.Body()
	out := make([]byte, 0, 200+len(body))
	out = append(out, "HTTP/1.1 "...)
	out = strconv.AppendInt(out, int64(status), 10)
	out = append(out, ' ')
	out = append(out, http.StatusText(status)...)
	out = append(out, "\r\nContent-Type: "+problem.ContentType+"\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(len(body)), 10)
	out = append(out, "\r\n\r\n"...)
	return append(out, body...), true
}

// truncate shortens net/http's reason to 64 bytes.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
