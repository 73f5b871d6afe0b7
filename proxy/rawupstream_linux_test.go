//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// rawUpstream is an upstream on a bare socket: it records each request's
// bytes exactly as they arrived (head, and a Content-Length body) and
// answers with the canned response its X-Respond header names.
type rawUpstream struct {
	ln  net.Listener
	mu  sync.Mutex
	got []string
}

// cannedResponses are the upstream's answers, by X-Respond. Each covers a
// framing the event loops relay differently.
var cannedResponses = map[string]string{
	"":        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Up: 1\r\nContent-Length: 3\r\n\r\nok\n",
	"chunked": "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n",
	"close":   "HTTP/1.1 200 OK\r\nConnection: close\r\nX-Up: closing\r\n\r\nuntil the end",
	"204":     "HTTP/1.1 204 No Content\r\nX-Up: none\r\n\r\n",
	"304":     "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nContent-Length: 10\r\n\r\n",
	"103":     "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
	"hop":     "HTTP/1.1 200 OK\r\nConnection: X-Hop, keep-alive\r\nX-Hop: drop\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
	"hop2":    "HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nX-Hop: drop\r\nX-Set: a\r\nconnection: x-hop2, keep-alive\r\nX-Hop2: drop\r\nx-request-id: up\r\nX-Set: b\r\nX-Request-Id: up2\r\nContent-Length: 2\r\n\r\nok",
	"big":     "HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + strings.Repeat("0123456789", 20000),
	"headcl":  "HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n",
	"lower":   "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-up-name: 1\r\ncontent-length: 2\r\n\r\nok",
}

func newRawUpstream(t *testing.T) *rawUpstream {
	t.Helper()
	u := &rawUpstream{}
	u.ln = serveRaw(t, u.serve)
	return u
}

func (u *rawUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		var head bytes.Buffer
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			head.WriteString(line)
			if line == "\r\n" {
				break
			}
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head.Bytes())))
		if err != nil {
			return
		}
		body := make([]byte, max(req.ContentLength, 0))
		if _, err := io.ReadFull(br, body); err != nil {
			return
		}
		if len(req.TransferEncoding) > 0 {
			// A chunked body, read whole (as sent) before the answer.
			if body, err = readChunkedRaw(br); err != nil {
				return
			}
		}
		u.mu.Lock()
		u.got = append(u.got, head.String()+string(body))
		u.mu.Unlock()
		resp := cannedResponses[req.Header.Get("X-Respond")]
		if req.Method == http.MethodHead && req.Header.Get("X-Respond") == "" {
			resp = cannedResponses["headcl"]
		}
		if _, err := io.WriteString(c, resp); err != nil || strings.Contains(resp, "Connection: close") {
			return
		}
	}
}

// readChunkedRaw reads a chunked body from br to the end of its trailers
// and returns its bytes as sent.
func readChunkedRaw(br *bufio.Reader) ([]byte, error) {
	var raw []byte
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		raw = append(raw, line...)
		sizeText, _, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ";")
		size, err := strconv.ParseInt(strings.TrimSpace(sizeText), 16, 32)
		if err != nil {
			return nil, err
		}
		if size == 0 {
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return nil, err
				}
				raw = append(raw, line...)
				if line == "\r\n" {
					return raw, nil
				}
			}
		}
		data := make([]byte, size+2) // and its CRLF
		if _, err := io.ReadFull(br, data); err != nil {
			return nil, err
		}
		raw = append(raw, data...)
	}
}

// take returns the requests received since the last take, with the
// upstream's own address (each gate has its own upstream) as "UPSTREAM".
func (u *rawUpstream) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	got := u.got
	u.got = nil
	for i := range got {
		got[i] = strings.ReplaceAll(got[i], u.ln.Addr().String(), "UPSTREAM")
	}
	return got
}
