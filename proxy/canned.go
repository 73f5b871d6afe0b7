package proxy

import (
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/fencing/problem"
)

// net/http answers a request it cannot read (a malformed head, one too
// large, an unsupported Transfer-Encoding or protocol version) itself,
// before the gate sees it, with a canned plain-text answer written straight
// to the connection and the connection closed. problemConn turns those
// into the gate's problem answers (400 invalid-request, 431, 501, 505,
// Connection: close), so every refusal a client gets is
// application/problem+json. On a TLS listener the canned answer stays as
// net/http writes it: the connection under TLS carries ciphertext.
//
// Only the canned form is rewritten: its header block is exactly
// cannedHeaders right after the status line, which no answer of the gate
// has (every one carries X-Request-Id, written before the fields net/http
// adds).
const cannedHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// cannedListener wraps each accepted connection in a problemConn.
type cannedListener struct{ net.Listener }

func (l cannedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return problemConn{c}, nil
}

// problemConn rewrites net/http's canned answers written to it.
type problemConn struct{ net.Conn }

func (c problemConn) Write(p []byte) (int, error) {
	if q, ok := cannedProblem(p); ok {
		if _, err := c.Conn.Write(q); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// unwrapConn is the connection under a problemConn.
func unwrapConn(c net.Conn) net.Conn {
	if p, ok := c.(problemConn); ok {
		return p.Conn
	}
	return c
}

// cannedProblem is the problem answer for canned answer p, if p is one.
func cannedProblem(p []byte) ([]byte, bool) {
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
		pr = problem.New(status, "invalid-request", "the gate speaks HTTP/1.x here (and HTTP/2 by TLS ALPN, or with prior knowledge when FENCEGATE_PROXY_H2C is on)")
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
