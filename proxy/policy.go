package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/url"
	"time"
)

// The upstream policy, one for every engine: how the gate reaches its
// upstream, how long it waits, and which failed requests it may retry.
//
//   - Dial: 5 s bound, TCP keep-alive 30 s (a Unix socket for a unix:
//     upstream).
//   - Idle connections are kept for upstreamIdle (a minute, as nginx and
//     net/http), at most Options.UpstreamConns connections in all; a request
//     that finds none free waits for one within UpstreamTimeout.
//   - One exchange (request sent, whole response received) is bounded by
//     UpstreamTimeout: 504 upstream-timeout when the response's head is
//     late, cut off when its body is.
//   - Retry only a request that was never sent: a write retried after it
//     left the gate could be applied twice. A pooled connection found
//     closed by the upstream as a request takes it is given up before a
//     byte goes (staleConnCheck; the event loops' upConn.closedByPeer), and
//     the request goes on another. The general engine's transport
//     retries reads on a pooled connection that turned out closed; a write
//     that carries an Idempotency-Key (which net/http would retry after
//     sending) goes on a connection of its own (freshTransport), as do all
//     writes with Options.NoWriteReuse.
//   - Failures are classed by upstreamFailed: never sent (dial failed, no
//     free connection: the barrier is left) or maybe applied (the barrier
//     is held for the grace period).
//   - Over HTTP/2 (Options.UpstreamHTTP2), each stream takes at most
//     upstreamStreamWindow of answer ahead of what the client has taken:
//     net/http's default, 4 MiB a stream, let a client that never reads
//     (an HTTP/2 window of 0, or a stalled HTTP/1.1 socket) make the gate
//     hold 4 MiB per request. 64 KiB is what an HTTP/1.1 upstream
//     connection costs the gate in buffers, and its flow-control window is
//     what bounds the upstream. The connection's window stays net/http's
//     (1 GiB): a small one would let a few stalled streams stop every
//     other stream on that connection.
const (
	upstreamDialTimeout  = 5 * time.Second
	upstreamIdle         = time.Minute
	upstreamLook         = time.Millisecond // the event loops' look at an idle connection (upConn.closedByPeer)
	upstreamStreamWindow = 64 << 10
)

// errNoFreeConns and errDialTimeout are the event loops' failures that
// prove a request never left the gate (see notSent).
var (
	errNoFreeConns = errors.New("proxy: no free upstream connection within the upstream timeout")
	errDialTimeout = errors.New("proxy: dialing the upstream timed out")
)

// upstreamDialer dials the upstream: its TCP address, or its Unix socket.
type upstreamDialer struct {
	network, addr string
	d             net.Dialer
}

func newUpstreamDialer(u *url.URL) *upstreamDialer {
	if u.Scheme == "unix" {
		return &upstreamDialer{network: "unix", addr: u.Path, d: net.Dialer{Timeout: upstreamDialTimeout}}
	}
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	return &upstreamDialer{network: "tcp", addr: addr, d: net.Dialer{Timeout: upstreamDialTimeout, KeepAlive: 30 * time.Second}}
}

// dial connects to the upstream, whatever address the transport asks for.
func (d *upstreamDialer) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	return d.d.DialContext(ctx, d.network, d.addr)
}

// newTransport is the general engine's connection pool to the upstream
// (see the policy above); reuse false makes every request use a
// connection of its own.
func newTransport(u *url.URL, d *upstreamDialer, conns int, tlsConfig *tls.Config, http2, reuse bool) *http.Transport {
	if tlsConfig == nil {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	t := &http.Transport{
		DialContext:            d.dial,
		TLSClientConfig:        tlsConfig,
		TLSHandshakeTimeout:    upstreamDialTimeout,
		MaxConnsPerHost:        conns,
		MaxIdleConns:           conns,
		MaxIdleConnsPerHost:    conns,
		IdleConnTimeout:        upstreamIdle,
		MaxResponseHeaderBytes: upstreamReadBuffer,
		DisableCompression:     true,
		DisableKeepAlives:      !reuse,
		Protocols:              new(http.Protocols),
	}
	if http2 {
		t.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerStream: upstreamStreamWindow}
	}
	switch {
	case http2 && u.Scheme == "https":
		t.Protocols.SetHTTP2(true) // by ALPN, HTTP/1.1 if the upstream refuses
		t.Protocols.SetHTTP1(true)
	case http2:
		t.Protocols.SetUnencryptedHTTP2(true) // prior knowledge (h2c)
	default:
		t.Protocols.SetHTTP1(true)
	}
	return t
}

// upstreamScheme is the scheme of the URLs the transport is asked for.
func upstreamScheme(u *url.URL) string {
	if u.Scheme == "https" {
		return "https"
	}
	return "http"
}

// mayReuse reports whether r may go on a pooled upstream connection: not
// a write that net/http would retry after sending it (Idempotency-Key),
// nor any write when writes never reuse connections.
func (g *Gate) mayReuse(r *http.Request) bool {
	if safeMethod(r.Method) {
		return true
	}
	if g.noWriteReuse {
		return false
	}
	_, k1 := r.Header["Idempotency-Key"]
	_, k2 := r.Header["X-Idempotency-Key"]
	return !k1 && !k2
}
