package proxy

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// NewTransport returns the gate's default transport to the upstream: a
// connection pool sized for a busy sidecar (the net/http default keeps only
// 2 idle connections per host, which under load churns connections and
// leaves thousands of sockets in TIME-WAIT), bounded dial and TLS handshake
// times, and responseHeaderTimeout as the wait for the upstream's response
// headers (zero means no limit). It ignores proxy environment variables:
// the gate talks to its upstream directly.
func NewTransport(responseHeaderTimeout time.Duration) *http.Transport {
	return &http.Transport{
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
		ResponseHeaderTimeout: responseHeaderTimeout,
	}
}

// bufferPool recycles the 32 KiB copy buffers of httputil.ReverseProxy, so
// relaying a body does not allocate one per request.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte { return *buffers.Get().(*[]byte) }

func (bufferPool) Put(b []byte) {
	if cap(b) == 32<<10 {
		b = b[:cap(b)]
		buffers.Put(&b)
	}
}
