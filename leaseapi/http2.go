package leaseapi

import "net/http"

// MaxConcurrentStreams bounds the HTTP/2 streams one client connection to
// the lease API may have open at once (HTTP2Config), as the write gate
// bounds its own (proxy.DefaultMaxConcurrentStreams).
const MaxConcurrentStreams = 128

// HTTP/2 receive windows of the lease API (HTTP2Config): the body bytes a
// client may send ahead of what the handlers have read, per stream and per
// connection. net/http's defaults, 1 MiB each, would let every connection
// park a megabyte of DATA in the server's buffers that no handler has
// asked for, outside the body budget (bodybudget.go). A lease call's body
// is tiny, and a checkpoint's still arrives at the speed the handler
// reads it.
const (
	streamWindow     = 64 << 10
	connectionWindow = 256 << 10
)

// HTTP2Config is the HTTP/2 configuration of an http.Server that serves
// the API over TLS (cmd/fencegate sets it): at most MaxConcurrentStreams
// streams a connection; receive windows of 64 KiB a stream and 256 KiB a
// connection, so unread DATA cannot pile up (net/http's default is 1 MiB
// each); frames of at most 16 KiB, the protocol's default, and a 4 KiB
// HPACK table, as the write gate has, so a connection's buffers stay
// small. The request bodies held at once are bounded apart from it, by
// Options.BodyMemory, and each stream's body by the server's ReadTimeout,
// which net/http applies per stream.
func HTTP2Config() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxConcurrentStreams:          MaxConcurrentStreams,
		MaxReceiveBufferPerStream:     streamWindow,
		MaxReceiveBufferPerConnection: connectionWindow,
		MaxReadFrameSize:              16 << 10,
		MaxDecoderHeaderTableSize:     4096,
	}
}
