package proxy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/internal/canned"
	"github.com/fencegate/fencegate/internal/connlimit"
)

// Defaults for the zero values of ServerOptions.
const (
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultIdleTimeout    = 2 * time.Minute
	DefaultMaxHeaderBytes = 8 << 10
)

// DefaultMaxConcurrentStreams bounds the HTTP/2 streams one client
// connection may have open at once.
const DefaultMaxConcurrentStreams = 128

// ServerOptions bound a gate's listener against slow, idle and oversized
// clients, and choose what it speaks.
type ServerOptions struct {
	// HeaderTimeout bounds how long a request's line and headers may take
	// to arrive, counted from its first byte (from the connection's
	// opening for the first request); a connection past it is closed
	// without an answer. The body has its own deadline
	// (Options.BodyTimeout). Zero means DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no new request
	// for this long. Zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's line and headers: a larger head is
	// refused (431) and its connection closed. Zero means
	// DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// MaxConns caps the open client connections: one beyond it gets a 503
	// too-many-connections answer, written before its request is read,
	// and is closed. A quarter of it caps the HTTP/2 requests in flight over
	// all connections (one connection carries many): one beyond is
	// answered 503 too-many-connections at once, its body unread (see
	// streamCap). Zero means no cap.
	MaxConns int
	// MaxConnsPerClient caps the open connections of one client (a TCP
	// peer's IP address, an IPv6 one's /64: connlimit.Client) the same
	// way, so that one client cannot take every place under MaxConns; a
	// connection refused for it counts against nothing. Half of it caps
	// one client's HTTP/2 requests in flight the same way (streamCap). A
	// listener without IP addresses (a Unix socket) is not capped per
	// client. Zero means no per-client cap.
	MaxConnsPerClient int
	// Logger receives connection errors the server cannot answer (a
	// client gone mid-response); nil discards.
	Logger *slog.Logger
	// NoIOURing makes the event loops (Linux) read and write one system
	// call at a time even where the kernel gives them an io_uring to
	// batch each pass's reads and writes through.
	NoIOURing bool
	// NoMarkReaders makes the event loops (Linux) admit every write
	// through the store's client, without the mark readers a store may
	// offer (fencing.MarkReaders).
	NoMarkReaders bool
	// NoEventLoops serves every connection with the general engine.
	NoEventLoops bool
	// Loops is how many event loops serve the listener (Linux); zero
	// means one per GOMAXPROCS, a spare processor not counted (see
	// loopCount and cpuProcs).
	Loops int
	// SpareProcessor gives the Go runtime one processor more than the
	// event loops hold, when they would hold all of them and the
	// GOMAXPROCS environment variable is unset (see spareProcessor;
	// FENCEGATE_SPARE_PROCESSOR). It changes GOMAXPROCS for the whole
	// process, once, when the loops start; the loops of a listener served
	// later in the process are still counted one per CPU.
	SpareProcessor bool
	// TLS, when set, makes the listener serve HTTPS (TLS 1.2 or later),
	// HTTP/2 by ALPN beside HTTP/1.1; with ClientCAs and
	// RequireAndVerifyClientCert it is mutual TLS. Its GetCertificate or
	// GetConfigForClient may change certificates while serving. On
	// Linux, the event loops serve its HTTP/1.1 connections through a
	// relay that terminates TLS in Go (looptls_linux.go), the general
	// engine its HTTP/2 ones.
	TLS *tls.Config
	// NoTLSLoops serves a TLS listener with the general engine alone
	// (FENCEGATE_TLS_LOOPS=false).
	NoTLSLoops bool
	// H2C serves HTTP/2 with prior knowledge on a cleartext listener
	// (FENCEGATE_PROXY_H2C). Off, such a connection is refused.
	H2C bool
	// MaxConcurrentStreams bounds the HTTP/2 streams per connection. Zero
	// means DefaultMaxConcurrentStreams. MaxConns and MaxConnsPerClient
	// bound them over all connections, and the receive windows the DATA
	// they may send ahead (h2streams.go).
	MaxConcurrentStreams int
}

// Server serves a Gate on a listener.
//
// Two engines serve it. On Linux, a TCP listener in front of an http
// upstream is served by event loops (one per CPU, see loopengine_linux.go)
// that forward plain HTTP/1.1 requests themselves and hand every other
// connection to the general engine: net/http's server (HTTP/2, h2c, gRPC,
// upgrades, streamed bodies), forwarding through net/http's transport
// (httpengine.go). On a TLS listener, the loops get the HTTP/1.1
// connections through a relay that terminates TLS in Go
// (looptls_linux.go), the general engine those that chose HTTP/2. Both
// take the same decision, admission pipeline and answers.
type Server struct {
	g             *Gate
	hs            *http.Server
	headerTimeout time.Duration
	idleTimeout   time.Duration
	maxHead       int
	limit         *connlimit.Counter // client connections, against MaxConns and MaxConnsPerClient
	streams       streamCap          // HTTP/2 requests in flight, against a quarter and half of those numbers
	tls           *tls.Config        // or nil
	// noLoops keeps the event loops off: the general engine serves every
	// connection (ServerOptions.NoEventLoops).
	noLoops bool
	// noRing makes the event loops read and write one system call at a
	// time, as they do where the kernel has no io_uring
	// (ServerOptions.NoIOURing).
	noRing bool
	// noMarks: ServerOptions.NoMarkReaders.
	noMarks bool
	// loopsWanted: ServerOptions.Loops.
	loopsWanted int
	// spareProcessor: ServerOptions.SpareProcessor.
	spareProcessor bool
	// handoff gives the general engine the connections the loops hand it.
	handoff *handoffListener

	mu    sync.Mutex
	ln    net.Listener
	loops atomic.Pointer[loopEngine] // nil: the general engine serves the listener
}

// NewServer returns a server for g.
func NewServer(g *Gate, opts ServerOptions) *Server {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		g:              g,
		headerTimeout:  cmp.Or(opts.HeaderTimeout, DefaultHeaderTimeout),
		idleTimeout:    cmp.Or(opts.IdleTimeout, DefaultIdleTimeout),
		maxHead:        cmp.Or(opts.MaxHeaderBytes, DefaultMaxHeaderBytes),
		limit:          connlimit.NewCounter(opts.MaxConns, 0, opts.MaxConnsPerClient),
		streams:        newStreamCap(opts.MaxConns, opts.MaxConnsPerClient),
		noRing:         opts.NoIOURing,
		noMarks:        opts.NoMarkReaders,
		loopsWanted:    opts.Loops,
		spareProcessor: opts.SpareProcessor,
		noLoops:        opts.NoEventLoops || opts.TLS != nil && opts.NoTLSLoops,
		handoff:        newHandoffListener(),
	}
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	if opts.TLS != nil {
		s.tls = opts.TLS.Clone()
		s.tls.MinVersion = max(s.tls.MinVersion, tls.VersionTLS12)
		s.tls.NextProtos = []string{"h2", "http/1.1"}
		protos.SetHTTP2(true)
	}
	if opts.H2C {
		protos.SetUnencryptedHTTP2(true)
	}
	s.hs = &http.Server{
		Handler:           serverHandler{g, s.streams},
		ReadHeaderTimeout: s.headerTimeout,
		IdleTimeout:       s.idleTimeout,
		// net/http allows 4 KiB beyond MaxHeaderBytes.
		MaxHeaderBytes: max(s.maxHead-4096, 1),
		TLSConfig:      s.tls,
		Protocols:      protos,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: cmp.Or(opts.MaxConcurrentStreams, DefaultMaxConcurrentStreams),
			// HPACK-decoded header lists are bounded like HTTP/1.1 heads.
			MaxDecoderHeaderTableSize: 4096,
			MaxReadFrameSize:          1 << 14,
			// What a client may send ahead of the gate's reads.
			MaxReceiveBufferPerStream:     h2StreamWindow,
			MaxReceiveBufferPerConnection: h2ConnWindow,
		},
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ConnContext: connContext,
	}
	return s
}

// engine is the event loops serving the listener, or nil.
func (s *Server) engine() *loopEngine { return s.loops.Load() }

// Serve accepts connections on ln until Shutdown or Close. It returns nil
// after those.
func (s *Server) Serve(ln net.Listener) error {
	var e *loopEngine
	if !s.noLoops {
		var err error
		if e, err = newLoopEngine(s, ln); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	s.loops.Store(e)
	if e != nil {
		s.g.log.Info("gate engine", "addr", ln.Addr().String(), "engine", "event loops", "loops", e.count(),
			"gomaxprocs", runtime.GOMAXPROCS(0))
		go func() { _ = s.hs.Serve(s.handoff) }()
		return e.serve()
	}
	s.g.log.Info("gate engine", "addr", ln.Addr().String(), "engine", "general")
	// The general engine serves the listener.
	var l net.Listener = &connlimit.Listener{Listener: ln, Counter: s.limit}
	if s.tls != nil {
		l = tls.NewListener(l, s.tls)
	} else {
		l = cannedListener(l)
	}
	err := s.hs.Serve(l)
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// serveHanded serves a connection the loops handed over on the general
// engine.
func (s *Server) serveHanded(c net.Conn) {
	if !s.handoff.give(problemConn(c)) {
		_ = c.Close()
	}
}

// Shutdown stops accepting, closes idle connections, and waits until the
// requests in progress are answered, and the event loops' work has ended
// (see CloseContext), or ctx ends (then it returns ctx's error and leaves
// the rest to Close or CloseContext).
//
// With the event loops, the general engine's part (the connections they
// handed over) drains beside theirs, from the start: net/http answers
// with Connection: close and reads nothing after, sends HTTP/2 clients a
// GOAWAY, and closes each connection once its last answer is written. A
// request the loops would hand over from then on is answered 503 draining
// by the loop, unforwarded (loopConn.handOver).
func (s *Server) Shutdown(ctx context.Context) error {
	e := s.engine()
	if e == nil {
		return ignoreClosed(s.hs.Shutdown(ctx))
	}
	handed := make(chan error, 1)
	go func() { handed <- s.hs.Shutdown(ctx) }()
	err := e.shutdown(ctx)
	s.closeListener()
	if err2 := ignoreClosed(<-handed); err == nil {
		err = err2
	}
	return err
}

// ignoreClosed is err, but nil for http.ErrServerClosed.
func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close closes every open connection at once: requests in progress are cut
// off. It is CloseContext without a bound.
func (s *Server) Close() error { return s.CloseContext(context.Background()) }

// CloseContext closes every open connection at once (requests in progress
// are cut off), stops the event loops and waits, until ctx ends, for the
// work they handed to goroutines (dials, admissions, waits for a turn,
// mark readers opening, handshakes), which it cancels. When that work
// ended in time, every barrier place the loops' writes took is left (or
// held for the grace) and every upstream connection they dialed is
// closed. When ctx ends first, it returns ctx's error and logs once what
// is left running: none of it forwards a write, and each leaves its place
// and closes its descriptor when it returns (see loopEngine.stop).
func (s *Server) CloseContext(ctx context.Context) error {
	var err error
	if e := s.engine(); e != nil {
		err = e.close(ctx)
		s.closeListener()
	}
	_ = s.hs.Close()
	s.handoff.Close()
	return err
}

func (s *Server) closeListener() {
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	_ = s.handoff.Close()
}

// serverHandler is the general engine's handler: the gate, behind the
// stream caps (streamCap), and with the TLS of a connection the loops
// handed over whose TLS a relay terminates (looptls_linux.go): net/http
// sees a plaintext socket, the gate must see the client's TLS
// (X-Forwarded-Proto https), as for a *tls.Conn. The client's address
// is the handed connection's RemoteAddr.
type serverHandler struct {
	g       *Gate
	streams streamCap
}

// tlsStateKey finds a handed connection's TLS in its requests' context.
type tlsStateKey struct{}

func (h serverHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil {
		if st, ok := r.Context().Value(tlsStateKey{}).(*tls.ConnectionState); ok {
			r.TLS = st
		}
	}
	client, counted, ok := h.streams.enter(r)
	if !ok {
		h.g.serveHTTP(w, r, tooManyStreams())
		return
	}
	if counted {
		defer h.streams.leave(client)
	}
	h.g.serveHTTP(w, r, nil)
}

// connContext notes the TLS of a handed connection whose TLS a relay
// terminates (see serverHandler).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if t, ok := canned.Unwrap(c).(interface{ tlsState() *tls.ConnectionState }); ok {
		if st := t.tlsState(); st != nil {
			return context.WithValue(ctx, tlsStateKey{}, st)
		}
	}
	return ctx
}

// headTimeoutProblem is the answer to a request whose head did not arrive
// within HeaderTimeout, where the engine answers one (the loops, on a
// partial head).
func headTimeoutProblem() *problem.Error {
	return problem.New(http.StatusRequestTimeout, "invalid-request", "the request's line and headers did not arrive in time")
}

// handoffListener is the general engine's listener for the connections
// the event loops hand over.
type handoffListener struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newHandoffListener() *handoffListener {
	return &handoffListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// give passes c to the general engine; false when it has stopped.
func (h *handoffListener) give(c net.Conn) bool {
	select {
	case h.conns <- c:
		return true
	case <-h.done:
		return false
	}
}

func (h *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

func (h *handoffListener) Close() error {
	h.closeOnce.Do(func() { close(h.done) })
	return nil
}

func (h *handoffListener) Addr() net.Addr { return &net.TCPAddr{} }

// decisionHeader is the subset of a request's headers decide reads, as an
// http.Header: Connection, Upgrade, Destination, the fencing headers, and
// any that an upstream might take for a method or path override or for a
// fencing header (suspectHeaders); nil when there are none. into, when not
// nil, is cleared and filled instead of a new map (an event loop reuses
// one).
func decisionHeader(r *loopRequest, into http.Header) http.Header {
	out := into
	clear(out)
	for k, v := range r.fields() {
		if !decisionHeaderName(k) {
			continue
		}
		if out == nil {
			out = make(http.Header, 2)
		}
		var name string
		switch string(k) { // the usual names, without a copy
		case HeaderToken:
			name = HeaderToken
		case HeaderResource:
			name = HeaderResource
		default:
			name = string(k)
		}
		out[name] = append(out[name], string(v))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// decisionHeaderName reports whether decide reads the header named k.
func decisionHeaderName(k []byte) bool {
	switch string(k) {
	case HeaderToken, HeaderResource, HeaderDestination, HeaderDestinationToken, "Connection", "Upgrade":
		return true
	}
	if len(k) < len("fencing-token") {
		return false
	}
	switch k[0] {
	case 'X', 'x':
		return true // suspectHeaders decides, on the normalized name
	case 'F', 'f':
		return bytes.IndexByte(k, '_') >= 0 // suspectHeaders decides
	}
	return false
}
