package proxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/fencing/reqid"
)

// upstreamReadBuffer bounds the upstream's response headers (like nginx's
// proxy_buffer_size, a larger head is answered 502).
const upstreamReadBuffer = 8 << 10

// hopHeaders are the hop-by-hop headers (RFC 9110 §7.6.1) the gate never
// forwards, in either direction, besides those a Connection header names.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// isHopHeader reports whether k is one of hopHeaders, in any case.
func isHopHeader(k []byte) bool { return nameIn(k, hopHeaders) }

// appendUpstreamHead appends to dst the head of x's request as the
// upstream gets it, for the event loops: a plain request (HTTP/1.1, no
// upgrade, a body of bodyLen bytes held in memory, an http upstream),
// written straight into the buffer the loop sends: the request the
// general engine sends for the same client request (TestUpstreamHeadAgrees
// holds the two together).
func (g *Gate) appendUpstreamHead(dst []byte, x *exchange, bodyLen int) []byte {
	in := x.c
	dst = append(dst, in.head.Method...)
	dst = append(dst, ' ')
	dst = appendUpstreamTarget(dst, g.upstreamBase, g.upstream.RawQuery, in.head.Target)
	dst = append(dst, " HTTP/1.1\r\n"...)
	method := string(in.head.Method)
	contentLength := bodyLen > 0 || method != http.MethodGet && method != http.MethodHead
	g.upstreamHeaders(x, false, func(k, v []byte) {
		if contentLength && string(k) != "User-Agent" && string(k) != "Host" && string(k) != "Content-Type" {
			// Where AppendBytes puts it: after those three.
			dst = append(dst, "Content-Length: "...)
			dst = strconv.AppendInt(dst, int64(bodyLen), 10)
			dst = append(dst, "\r\n"...)
			contentLength = false
		}
		dst = append(append(append(append(dst, k...), ": "...), v...), "\r\n"...)
	})
	return append(dst, "\r\n"...)
}

// upstreamHeaders calls add with each header field of x's request as the
// upstream gets it, in the order it gets them, Content-Length aside (the
// engine sending the body sets it):
//   - User-Agent, then Host (the upstream's), then Content-Type (of each
//     the client's last, when not empty);
//   - the client's other fields, in the order it sent them, minus the
//     hop-by-hop ones (with upgrade, Connection and Upgrade stay), those
//     any of the client's Connection fields names (never the fencing
//     headers), and replacedHeaders;
//   - "TE: trailers" when the client accepts trailers (TE is hop-by-hop;
//     only that value matters end to end);
//   - X-Forwarded-For, -Host and -Proto stating what the gate saw, and the
//     request id: every one of these the client sent was left out, as
//     the gate does not relay claims;
//   - the client's Cookie fields, in the order it sent them, empty ones
//     left out.
//
// The general engine sends the same fields (rewrite, in httpengine.go),
// in net/http's order; TestUpstreamHeadAgrees holds the two together.
func (g *Gate) upstreamHeaders(x *exchange, upgrade bool, add func(k, v []byte)) {
	in := x.c
	var named []string // what every Connection field names
	trailers := false
	for k, v := range in.fields() {
		switch string(k) {
		case "Connection":
			named = append(named, connectionOptions(v)...)
		case "Te":
			trailers = trailers || containsFold(v, "trailers")
		}
	}
	keep := func(k []byte) bool {
		switch {
		case upgrade && (string(k) == "Connection" || string(k) == "Upgrade"):
			return true
		case isHopHeader(k), nameIn(k, replacedHeaders):
			return false
		}
		return !nameIn(k, named) || nameIn(k, judgedHeaders) // named is nearly always empty
	}
	if ua := in.last("User-Agent"); len(ua) > 0 && keep(hdrUserAgent) {
		add(hdrUserAgent, ua)
	}
	add(hdrHost, g.upstreamHost)
	if ct := in.last("Content-Type"); len(ct) > 0 && keep(hdrContentType) {
		add(hdrContentType, ct)
	}
	for k, v := range in.fields() {
		switch string(k) {
		case "Host", "Content-Length", "Content-Type", "User-Agent":
			continue // added above, or by the engine
		case "Cookie":
			continue // the cookies go last
		}
		if keep(k) {
			if x.destination != "" && strings.EqualFold(string(k), HeaderDestination) {
				v = []byte(x.destination)
			}
			add(k, v)
		}
	}
	if trailers {
		add(hdrTE, hdrTrailers)
	}
	// The values made here are built in x's own buffer: add's arguments
	// escape, and a buffer of this call's would be allocated for each.
	vals := x.headerBuf[:0]
	if in.remote != nil {
		if a, ok := netip.AddrFromSlice(in.remote.IP); ok {
			vals = a.Unmap().AppendTo(vals)
			add(hdrForwardedFor, vals)
		}
	}
	add(hdrForwardedHost, in.head.Host)
	if in.tls { // a connection whose TLS a relay terminates (looptls_linux.go)
		add(hdrForwardedProto, hdrHTTPS)
	} else {
		add(hdrForwardedProto, hdrHTTP)
	}
	add(hdrRequestID, append(vals[len(vals):], x.id...))
	if keep(hdrCookie) {
		for k, v := range in.fields() {
			if string(k) == "Cookie" && len(v) > 0 {
				add(hdrCookie, v)
			}
		}
	}
}

// The names and values upstreamHeaders adds.
var (
	hdrUserAgent, hdrHost, hdrContentType, hdrCookie = []byte("User-Agent"), []byte("Host"), []byte("Content-Type"), []byte("Cookie")
	hdrTE, hdrTrailers                               = []byte("Te"), []byte("trailers")
	hdrForwardedFor, hdrForwardedHost                = []byte("X-Forwarded-For"), []byte("X-Forwarded-Host")
	hdrForwardedProto, hdrHTTP, hdrHTTPS             = []byte("X-Forwarded-Proto"), []byte("http"), []byte("https")
	hdrRequestID                                     = []byte(reqid.Header)
)

// judgedHeaders are the headers a write's fencing is read from (its
// tokens, its resource, the second resource of a COPY or MOVE): always
// forwarded, by both engines, even when the client's Connection header
// names them, so that the upstream gets the request as judged.
var judgedHeaders = []string{HeaderToken, HeaderResource, HeaderDestinationToken, HeaderDestination}

// replacedHeaders are the client's header fields the gate never forwards,
// whatever their case: the forwarding headers and the request id (the gate
// sets its own), Expect (the gate has the body, or streams it: no
// 100-continue upstream), Forwarded (not relayed, like X-Forwarded-*), and
// Content-Length (set for the body the gate sends).
var replacedHeaders = []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", reqid.Header,
	"Expect", "Forwarded", "Content-Length"}

// containsFold reports whether v contains s, in any case.
func containsFold(v []byte, s string) bool {
	for i := 0; i+len(s) <= len(v); i++ {
		if strings.EqualFold(string(v[i:i+len(s)]), s) {
			return true
		}
	}
	return false
}

// nameIn reports whether header name k is one of names, in any case.
func nameIn(k []byte, names []string) bool {
	for _, n := range names {
		if len(n) == len(k) && strings.EqualFold(n, string(k)) {
			return true
		}
	}
	return false
}

// upstreamTarget is the request target the upstream gets for a client's
// target: the upstream URL's base path (base, without its trailing slash)
// joined with the path the client sent, byte for byte, and the upstream
// URL's query (baseQuery) joined with the client's ("?x=1" and "?y=2" give
// "?x=1&y=2"), as httputil.ReverseProxy joins them.
func upstreamTarget(base, baseQuery string, target []byte) []byte {
	return appendUpstreamTarget(make([]byte, 0, len(base)+len(target)+len(baseQuery)+2), base, baseQuery, target)
}

// appendUpstreamTarget appends upstreamTarget's result to out.
func appendUpstreamTarget(out []byte, base, baseQuery string, target []byte) []byte {
	o := originForm(target)
	path, query, hasQuery := bytes.Cut(o, []byte("?"))
	out = append(append(out, base...), path...)
	switch {
	case baseQuery != "" && hasQuery && len(query) > 0:
		out = append(append(append(append(out, '?'), baseQuery...), '&'), query...)
	case baseQuery != "":
		out = append(append(out, '?'), baseQuery...)
	case hasQuery:
		out = append(append(out, '?'), query...)
	}
	return out
}

// originForm is the path and query of a request target: itself when it
// is origin-form, the part after the authority when absolute-form.
func originForm(target []byte) []byte {
	if len(target) > 0 && target[0] == '/' {
		return target
	}
	if i := bytes.Index(target, []byte("://")); i >= 0 {
		rest := target[i+3:]
		if j := bytes.IndexAny(rest, "/?"); j >= 0 {
			if rest[j] == '?' {
				return append([]byte("/"), rest[j:]...)
			}
			return rest[j:]
		}
	}
	return []byte("/")
}

// connectionOptions are the header names a Connection header lists.
func connectionOptions(v []byte) []string {
	if len(v) == 0 || bytes.EqualFold(v, []byte("keep-alive")) || bytes.EqualFold(v, []byte("close")) {
		return nil // the common values, without a copy
	}
	var names []string
	for opt := range strings.SplitSeq(string(v), ",") {
		if opt = strings.TrimSpace(opt); opt != "" && !strings.EqualFold(opt, "close") && !strings.EqualFold(opt, "keep-alive") {
			names = append(names, opt)
		}
	}
	return names
}

// upstreamFailed answers a request whose forwarding failed: the client's
// request body failed (stalled past BodyTimeout → 408, malformed or cut
// short → 400), the upstream timed out → 504, anything else → 502. For a
// fenced write whose request may have reached the upstream, the barrier
// stays closed for the grace period.
func (g *Gate) upstreamFailed(x *exchange, t flight, err error) {
	fenced := t != nil
	// A request whose headers were sent, even with its body cut off, may
	// be applied: an upstream can act on a request before reading its
	// body (a DELETE handler that ignores it), so only a request that
	// never left the gate, or that the upstream turned away unprocessed
	// by protocol, is certainly not applied.
	refused := refusedUnprocessed(err)
	sent := !notSent(err) && !refused
	if fenced {
		if sent {
			t.Hold(g.grace)
		} else {
			t.Leave()
		}
	}
	// The client's body error comes first: reading it is what failed.
	p := bodyProblem(x.body.failure(), sent, fenced && sent)
	switch {
	case p != nil:
	case isTimeout(err):
		p = problem.New(http.StatusGatewayTimeout, "upstream-timeout", "the upstream did not answer in time")
		if fenced {
			p.Detail += "; the write may still be applied by the upstream"
		}
	case refused:
		p = problem.New(http.StatusBadGateway, "upstream-unavailable", "the upstream refused the request before processing it (HTTP/2 REFUSED_STREAM, or GOAWAY as it shuts down); nothing was applied, and it may be sent again")
	case errors.Is(err, errStaleConn):
		p = problem.New(http.StatusBadGateway, "upstream-unavailable", "the upstream had closed the connection the request was given, and the request could not go on another; nothing was sent")
	case !sent:
		p = problem.New(http.StatusBadGateway, "upstream-unavailable", "the upstream could not be reached (or no connection to it was free in time)")
	case fenced || x.flight != nil:
		// Sent: also when the engine's flight had already ended (an
		// upstream that switched protocols on a write, say).
		p = problem.New(http.StatusBadGateway, "upstream-unavailable", "the upstream failed before answering; the write was sent, and may have been applied")
	default:
		p = problem.New(http.StatusBadGateway, "upstream-unavailable", "the upstream failed before answering")
	}
	p.Cause = err
	if fenced {
		g.count(x, p.Code)
	}
	g.writeProblem(x, p)
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// refusedUnprocessed reports whether err is the HTTP/2 transport's word
// that the upstream turned the request away before processing any of it:
// its stream reset with REFUSED_STREAM (a server at its stream limit), or
// left out by a GOAWAY (a server shutting down gracefully names the last
// stream it will process). RFC 9113 §8.7 makes both a promise that
// nothing of the request was processed, so it may be sent again; a server
// that breaks that promise could apply a write the gate has let go of.
// net/http's transport gives these only as text (its errors are
// unexported, and it formats the reset with %v once it cannot rewind the
// body), so the test is on its words, the whole text matched: text the
// upstream chooses (a GOAWAY's debug data, a status line) is quoted
// inside other errors and must never pass for them.
// TestH2RefusedWritesAreNotApplied fails if net/http's words change.
func refusedUnprocessed(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	if inner, ok := strings.CutPrefix(s, h2CannotRetryPrefix); ok {
		if inner, ok = strings.CutSuffix(inner, h2CannotRetrySuffix); ok {
			s = inner
		}
	}
	return h2Unprocessed.MatchString(s)
}

// The words of net/http's HTTP/2 transport (Go 1.26, h2_bundle.go): a
// retryable error it could not retry for want of GetBody, and the three
// that say a stream was not processed.
const (
	h2CannotRetryPrefix = "http2: Transport: cannot retry err ["
	h2CannotRetrySuffix = "] after Request.Body was written; define Request.GetBody to avoid this error"
)

var h2Unprocessed = regexp.MustCompile(`^(?:stream error: stream ID \d+; REFUSED_STREAM; received from peer` +
	`|http2: Transport received Server's graceful shutdown GOAWAY` +
	`|http2: Transport received GOAWAY from server ErrCode:[A-Z_]+)$`)

// notSent reports whether err proves the request never left the gate: the
// connection to the upstream could not be made, none was free in time, or
// each one it was given had been closed by the upstream (errStaleConn).
func notSent(err error) bool {
	var oe *net.OpError
	return (errors.As(err, &oe) && oe.Op == "dial") || errors.Is(err, errNoFreeConns) ||
		errors.Is(err, errDialTimeout) || errors.Is(err, errStaleConn)
}
