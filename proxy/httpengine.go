package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/fencing/reqid"
)

// The general engine: the gate as a net/http handler, behind net/http's
// server (HTTP/1.1, HTTP/2 by ALPN or prior knowledge, TLS) and forwarding
// through httputil.ReverseProxy over net/http's transport (see policy.go).
// It serves every request the event loops do not: all of them on a TLS
// listener, off Linux, or with the loops off; elsewhere the connections
// the loops hand over (a streamed body, an upgrade, Expect, HTTP/1.0, a
// head the loops do not read).

// ServeHTTP decides, fences and forwards one request (see decide for the
// contract). Any engine's refusal, admission and forwarding rules apply
// unchanged; a gRPC call's refusals are gRPC answers (see grpc.go).
func (g *Gate) ServeHTTP(rw http.ResponseWriter, r *http.Request) { g.serveHTTP(rw, r, nil) }

// serveHTTP is ServeHTTP; a refusal that is not nil (the server's stream
// caps: streamCap) answers the request whatever the decision, before its
// body is read or the store asked.
func (g *Gate) serveHTTP(rw http.ResponseWriter, r *http.Request, refusal *problem.Error) {
	w := &answerWriter{ResponseWriter: rw}
	x := &exchange{w: w, r: r, ctx: context.Background(), start: time.Now(), grpc: isGRPC(r)}
	x.id = reqid.Choose([]byte(r.Header.Get(reqid.Header)))
	w.id = x.id
	x.method = r.Method
	d := g.judge(x, Incoming{Method: r.Method, Target: r.RequestURI, Host: r.Host, Header: r.Header})
	defer g.end(x)
	if refusal != nil {
		d = Decision{Verdict: Refuse, Problem: refusal}
	} else if p := contentLengthProblem(r); p != nil && d.Verdict != Refuse {
		d = Decision{Verdict: Refuse, Problem: p}
	}
	switch g.verdict(x, d) {
	case passForward, passUpgrade:
		g.forwardHTTP(x, nil)
	case passFence:
		if t, ok := g.admitWrite(x, d); ok {
			g.forwardHTTP(x, t)
		}
	}
}

// exchangeKey finds a request's exchange in its context.
type exchangeKey struct{}

// forwardHTTP sends x's request to the upstream and relays the answer. t
// is the write's place at the barrier (nil for an unfenced request): it is
// left once the upstream's response headers have arrived and the request
// has been written whole (see sendingFlight), or held for the grace period
// when the outcome is unknown.
func (g *Gate) forwardHTTP(x *exchange, t flight) {
	defer x.releaseBody()
	r := x.r
	if x.buffered == nil && r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		g.setBodyDeadline(x) // from the start of the forwarding, after the barrier
		// Its first piece is read before anything is sent: a body that is
		// malformed or stalls from its start is refused unforwarded.
		first, err := readFirst(r.Body)
		if err != nil {
			p := bodyProblem(err, false, false)
			if t != nil {
				t.Leave()
				g.count(x, p.Code)
			}
			g.writeProblem(x, p)
			return
		}
		x.body = &bodyReader{r: io.MultiReader(bytes.NewReader(first), r.Body), left: int(r.ContentLength)}
		if r.ProtoMajor == 1 {
			x.w.body = x.body
		}
		// The answer may come while the body still streams (a full-duplex
		// call): net/http's HTTP/1 server would otherwise read the rest of
		// the body away before it writes the answer's head, from under the
		// transport that is forwarding it. HTTP/2 is always full duplex.
		_ = http.NewResponseController(x.w).EnableFullDuplex()
	}
	// Not r's own context: net/http cancels it when the client's side of
	// the connection reads EOF, which a client that half-closes after its
	// whole request (nc -N, HTTP/1.0 tools) does too. A write that has
	// left for the upstream stays with it until the upstream answers or
	// UpstreamTimeout passes, whatever the client does meanwhile, as on the
	// event loops: cancelling it would answer 502 for a write the upstream
	// may apply, and hold the barrier for the grace.
	ctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(r.Context()), exchangeKey{}, x), g.upstreamTO)
	defer cancel()
	if t != nil {
		x.flight = &sendingFlight{place: t, grace: g.grace}
		defer x.flight.finish() // after the answer is relayed, or the exchange failed
		ctx = x.flight.trace(ctx)
	}
	if g.beforeSend != nil {
		g.beforeSend()
	}
	p := g.pooled
	if !g.mayReuse(r) {
		p = g.fresh
	}
	defer flushHeadOnAbort(x.w)
	p.ServeHTTP(x.w, r.WithContext(ctx))
}

// flushHeadOnAbort, deferred around the ReverseProxy, sends the client the
// head already written when the upstream's answer is cut off (ReverseProxy
// aborts with http.ErrAbortHandler, and net/http would drop the head it
// holds with the connection): the client sees the upstream's status and
// a cut body, as on the event loops, not a connection closed with no
// answer, which a client cannot tell from a write never answered.
func flushHeadOnAbort(w *answerWriter) {
	if v := recover(); v != nil {
		if v == http.ErrAbortHandler && w.status != 0 {
			_ = http.NewResponseController(w).Flush()
		}
		panic(v)
	}
}

// readFirst reads the first piece of a streamed body (io.EOF: an empty
// one is no error).
func readFirst(body io.Reader) ([]byte, error) {
	buf := make([]byte, 4<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 || err == io.EOF {
			return buf[:n], nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// newReverseProxy is the general engine's forwarder over transport t.
func (g *Gate) newReverseProxy(t http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      t,
		ModifyResponse: g.answered,
		ErrorHandler:   g.proxyError,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		BufferPool:     relayBuffers{},
	}
}

// rewrite makes the upstream's request from the client's (see
// upstreamHeaders for what it carries): the path as judged, byte for byte,
// under the upstream's base path; the upstream's Host (a unix: upstream
// keeps the client's); the hop-by-hop fields and those the client's
// Connection names gone, except judgedHeaders; the forwarding
// headers and the request id the gate's own. ReverseProxy has already
// removed the hop-by-hop fields, kept "TE: trailers", and the client's
// X-Forwarded-* fields.
func (g *Gate) rewrite(pr *httputil.ProxyRequest) {
	x := pr.In.Context().Value(exchangeKey{}).(*exchange)
	in, out := pr.In, pr.Out
	target := string(upstreamTarget(g.upstreamBase, g.upstream.RawQuery, []byte(in.RequestURI)))
	path, query, hasQuery := strings.Cut(target, "?")
	host := g.urlHost
	if strings.HasPrefix(path, "//") {
		// The origin-form would read as an authority: send the
		// absolute-form, naming the upstream itself.
		path = "//" + host + path
	}
	out.URL = &url.URL{Scheme: g.urlScheme, Host: host, Opaque: path, RawQuery: query, ForceQuery: hasQuery && query == ""}
	if g.dialer.network == "unix" {
		out.Host = in.Host
	} else {
		out.Host = g.upstream.Host
	}
	h := out.Header
	for _, k := range judgedHeaders {
		if v, ok := in.Header[k]; ok {
			h[k] = v // even when the client's Connection names them
		}
	}
	for _, k := range replacedHeaders {
		h.Del(k)
	}
	for _, k := range [...]string{"User-Agent", "Content-Type"} {
		if v := h[k]; len(v) > 1 {
			h[k] = v[len(v)-1:] // the last, as the loops send
		}
	}
	if h.Get("Content-Type") == "" {
		delete(h, "Content-Type") // an empty one says nothing, and the loops drop it
	}
	if ap, err := netip.ParseAddrPort(in.RemoteAddr); err == nil {
		h["X-Forwarded-For"] = []string{ap.Addr().Unmap().String()}
	}
	h["X-Forwarded-Host"] = []string{in.Host}
	if in.TLS != nil {
		h["X-Forwarded-Proto"] = []string{"https"}
	} else {
		h["X-Forwarded-Proto"] = []string{"http"}
	}
	h[reqid.Header] = []string{x.id}
	if x.destination != "" {
		h[HeaderDestination] = []string{x.destination} // under the upstream's base path, as judged
	}
	// The body goes again on another connection only through x.replay,
	// which staleConnCheck alone uses, on the pooled HTTP/1 connections,
	// while nothing of the request was written; an HTTP/2 upstream gets
	// none. GetBody stays nil here: an HTTP/2 transport resends a request
	// with a GetBody after the upstream reset its stream, which it may
	// have applied.
	replay := !g.upstreamHTTP2
	switch {
	case x.buffered != nil && len(*x.buffered) == 0:
		// An HTTP/2 request's content-length: 0: no body, sent as
		// Content-Length: 0, as from an HTTP/1.1 client (a non-nil body
		// of no declared length would go chunked).
		out.Body, out.ContentLength = nil, 0
	case x.buffered != nil:
		b := *x.buffered
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		if replay {
			x.replay = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		}
	case x.body != nil && replay:
		rb := newReplayableBody(x.body)
		out.Body, x.replay = rb.first(), rb.again
	case x.body != nil:
		out.Body = io.NopCloser(x.body)
	}
	out.GetBody = nil // never resent, but by staleConnCheck
	if g.upstreamHTTP2 && out.Body == nil && !safeMethod(in.Method) {
		// The HTTP/2 transport resends a request without a body after its
		// stream was reset with PROTOCOL_ERROR, as freely as one it never
		// sent: a body it cannot rewind stops that. It goes as an empty
		// DATA frame that ends the stream, a body of no bytes (and, to an
		// https upstream that chose HTTP/1.1 by ALPN, as an empty chunked
		// body).
		out.Body = emptyBody{}
	}
	out.Trailer = nil // trailers arrive after the decision: never forwarded
}

// emptyBody is a request body of no bytes that a transport cannot send
// again (it is not http.NoBody).
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }

// answered runs when the upstream's response head arrives: a fenced
// write's place at the barrier is left once its request has been written
// whole (the next token may go while the answer's body is relayed), and the
// upstream's request id gives way to the gate's. A head no upstream may
// send (oddAnswer) fails the exchange instead, before the place is left:
// the write was sent and may have been applied, so it holds the barrier,
// and the client gets a 502, as on the event loops.
func (g *Gate) answered(resp *http.Response) error {
	x := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	if err := g.oddAnswer(resp); err != nil {
		return err
	}
	if x.flight != nil {
		x.flight.answer()
		x.audit.answered(resp.StatusCode)
		g.count(x, CodeAdmitted)
	}
	resp.Header.Del(reqid.Header) // the gate's is already set
	return nil
}

// oddAnswer refuses a response head that net/http's transport reads but
// the event loops' parser (internal/h1) does not take: a status outside
// 100 to 599 (net/http's server panics writing one), a version other than
// HTTP/1.0 or 1.1 (or 2.0 from an HTTP/2 upstream), and a 101 to a request
// that asked for no upgrade.
func (g *Gate) oddAnswer(resp *http.Response) error {
	switch {
	case resp.StatusCode < 100 || resp.StatusCode > 599:
		return fmt.Errorf("proxy: the upstream answered status %d", resp.StatusCode)
	case resp.ProtoMajor == 1 && resp.ProtoMinor <= 1, resp.ProtoMajor == 2 && resp.ProtoMinor == 0 && g.upstreamHTTP2:
	default:
		return fmt.Errorf("proxy: the upstream answered in %s", resp.Proto)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols && resp.Request.Header.Get("Upgrade") == "" {
		return errors.New("proxy: the upstream switched protocols on a request that asked for no upgrade")
	}
	return nil
}

// proxyError answers a request whose forwarding failed (upstreamFailed).
func (g *Gate) proxyError(_ http.ResponseWriter, r *http.Request, err error) {
	x := r.Context().Value(exchangeKey{}).(*exchange)
	var t flight
	if x.flight != nil && x.flight.failed() {
		t = x.flight.place
	}
	g.upstreamFailed(x, t, err)
}

// answerWriter is the client's response writer on the general engine: it
// remembers the status sent (for telemetry), and adds no Date or
// Content-Type the upstream did not send.
type answerWriter struct {
	http.ResponseWriter
	id     string // the request id, on every answer
	status int
	// body is an HTTP/1 request's streamed body, or nil. An answer that
	// comes before it has been read whole (the upstream answered early)
	// closes the connection after it: the rest of the body may never be
	// read, and what the client sends next could otherwise be taken for
	// its next request.
	body *bodyReader
}

func (w *answerWriter) WriteHeader(code int) {
	w.Header().Set(reqid.Header, w.id) // also after an interim answer, which clears the map
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
		h := w.Header()
		for _, k := range [...]string{"Date", "Content-Type"} {
			if _, ok := h[k]; !ok {
				h[k] = nil // present: net/http adds none
			}
		}
		if w.body.unfinished() {
			h.Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController (deadlines, flushes, the hijack of
// an upgrade) reach the server's writer.
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeProblemHTTP sends p as x's answer on the general engine.
func (g *Gate) writeProblemHTTP(x *exchange, p *problem.Error) {
	if x.w.status != 0 {
		return // the upstream's answer has begun: cut off, nothing to add
	}
	if x.grpc {
		writeGRPCProblem(x.w, p)
		return
	}
	h := x.w.Header()
	for k, vs := range p.Headers {
		if k == "Connection" && x.r.ProtoMajor >= 2 {
			continue // HTTP/2 has no Connection field; the stream ends anyway
		}
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Type", problem.ContentType)
	body := p.Body()
	h.Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(p.Status)
	_, _ = x.w.Write(body)
}

// delUpgrade drops the request's Upgrade header (an h2c offer on a read).
func (x *exchange) delUpgrade() {
	if x.c == nil { // the loops take no request with an Upgrade field
		x.r.Header.Del("Upgrade")
	}
}

// upgrade reports whether the request asks for a protocol upgrade.
func (x *exchange) upgrade() bool {
	if x.c != nil {
		return false // the loops take no request with an Upgrade field
	}
	return x.r.Header.Get("Upgrade") != ""
}

// remoteAddr is the client's address.
func (x *exchange) remoteAddr() net.Addr {
	if x.c != nil {
		if x.c.remote == nil {
			return &net.TCPAddr{}
		}
		return x.c.remote
	}
	if ap, err := netip.ParseAddrPort(x.r.RemoteAddr); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	return &net.UnixAddr{Name: x.r.RemoteAddr, Net: "unix"}
}

// relayBuffers recycles the buffers ReverseProxy copies bodies through.
type relayBuffers struct{}

func (relayBuffers) Get() []byte  { return *(relayBufferPool.Get().(*[]byte)) }
func (relayBuffers) Put(b []byte) { relayBufferPool.Put(&b) }

// unixHost is the URL host of requests to a unix: upstream (the request's
// Host header is the client's; this only names the pool's key).
const unixHost = "unix-socket"
