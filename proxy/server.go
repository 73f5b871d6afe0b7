package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/internal/connlimit"
)

// Defaults for the zero values of ServerOptions.
const (
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultIdleTimeout    = 2 * time.Minute
	DefaultMaxHeaderBytes = 8 << 10
)

// ServerOptions bound a gate's listener against slow, idle and oversized
// clients.
type ServerOptions struct {
	// HeaderTimeout bounds how long a request's line and headers may take
	// to arrive, counted from its first byte (from the connection's
	// opening for the first request). The body has its own deadline
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
	// and is closed. Zero means no cap.
	MaxConns int
	// Logger receives connection errors the server cannot answer (a
	// client gone mid-response); nil discards.
	Logger *slog.Logger
	// NoIOURing makes the event loops (Linux) read and write one system
	// call at a time even where the kernel gives them an io_uring to
	// batch each pass's reads and writes through.
	NoIOURing bool
}

// Server serves a Gate on a listener: HTTP/1.1 with keep-alive and
// pipelining, strict framing, request bodies streamed to the handler.
//
// Two engines serve it. On Linux, a TCP listener in front of an http
// upstream is served by event loops (one per two CPUs, see loop_linux.go) that
// forward plain requests themselves and hand every other connection to a
// fasthttp server; elsewhere, the fasthttp server serves every
// connection. Both apply the same parser, decisions and answers.
type Server struct {
	g             *Gate
	srv           *fasthttp.Server
	headerTimeout time.Duration
	idleTimeout   time.Duration
	maxHead       int
	limit         *connlimit.Counter // client connections, against MaxConns
	// noLoops keeps the event loops off: the fasthttp server serves
	// every connection. Only tests set it, to compare the engines.
	noLoops bool
	// noRing makes the event loops read and write one system call at a
	// time, as they do where the kernel has no io_uring
	// (ServerOptions.NoIOURing).
	noRing bool

	mu    sync.Mutex
	conns map[net.Conn]struct{} // open connections of the fasthttp engine, closed by Close
	ln    net.Listener
	loops atomic.Pointer[loopEngine] // nil: the fasthttp server serves the listener; read per request
}

// NewServer returns a server for g.
func NewServer(g *Gate, opts ServerOptions) *Server {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		g:             g,
		conns:         make(map[net.Conn]struct{}),
		headerTimeout: cmp.Or(opts.HeaderTimeout, DefaultHeaderTimeout),
		idleTimeout:   cmp.Or(opts.IdleTimeout, DefaultIdleTimeout),
		maxHead:       cmp.Or(opts.MaxHeaderBytes, DefaultMaxHeaderBytes),
		limit:         connlimit.NewCounter(opts.MaxConns, 0),
		noRing:        opts.NoIOURing,
	}
	s.srv = &fasthttp.Server{
		Handler:      s.serve,
		ErrorHandler: g.readError,
		// Once the head is in, the body has its own deadline, and at most
		// BodyBuffer bytes of it (at most 8 KiB, at least 1) are read
		// before the handler runs; the rest streams.
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: g.bodyTimeout, MaxRequestBodySize: max(g.bodyBuffer, 1)}
		},
		// The read deadline covers the head; the handler moves it for the
		// body (Options.BodyTimeout).
		ReadTimeout:                   s.headerTimeout,
		IdleTimeout:                   s.idleTimeout,
		ReadBufferSize:                s.maxHead,
		StreamRequestBody:             true,
		DisablePreParseMultipartForm:  true,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		NoDefaultDate:                 true,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		Logger:                        slogPrinter{log},
		// Called on every request too (active, idle): lock only for the
		// states that change the set.
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			switch st {
			case fasthttp.StateNew:
				s.mu.Lock()
				s.conns[c] = struct{}{}
				s.mu.Unlock()
			case fasthttp.StateClosed, fasthttp.StateHijacked:
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			case fasthttp.StateIdle, fasthttp.StateActive:
				if e := s.engine(); e != nil {
					e.setIdle(c, st == fasthttp.StateIdle)
				}
			}
		},
	}
	return s
}

// serve is the fasthttp server's handler: the gate's, closing the
// connection after the answer once the server is shutting down.
func (s *Server) serve(c *fasthttp.RequestCtx) {
	s.g.serve(c)
	if e := s.engine(); e != nil && e.closing.Load() {
		c.SetConnectionClose()
	}
}

// engine is the event loops serving the listener, or nil.
func (s *Server) engine() *loopEngine { return s.loops.Load() }

// Serve accepts connections on ln until Shutdown or Close. It returns nil
// after those.
func (s *Server) Serve(ln net.Listener) error {
	e, err := newLoopEngine(s, ln)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	s.loops.Store(e)
	if e != nil {
		return e.serve()
	}
	err = s.srv.Serve(&connlimit.Listener{Listener: ln, Counter: s.limit})
	if err != nil && errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting, closes idle connections, and waits until the
// requests in progress are answered or ctx ends (then it returns ctx's
// error and leaves the rest to Close).
func (s *Server) Shutdown(ctx context.Context) error {
	if e := s.engine(); e != nil {
		err := e.shutdown(ctx)
		s.closeListener()
		return err
	}
	return s.srv.ShutdownWithContext(ctx)
}

// Close closes every open connection at once: requests in progress are cut
// off.
func (s *Server) Close() error {
	if e := s.engine(); e != nil {
		e.close()
		s.closeListener()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		_ = c.Close()
	}
	return nil
}

func (s *Server) closeListener() {
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

// readError answers a request that fasthttp could not read: a head it
// refused to parse (a malformed line or header, a duplicate
// Content-Length, an unsupported Transfer-Encoding: 400 invalid-request; a
// head past MaxHeaderBytes: 431; a head not in within HeaderTimeout: 408),
// or the first piece of a body that stalled or broke before the handler
// ran (408 body-timeout, 400 invalid-body). Nothing was forwarded, and the
// connection is closed after the answer.
func (g *Gate) readError(c *fasthttp.RequestCtx, err error) {
	var p *problem.Error
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small):
		p = problem.New(http.StatusRequestHeaderFieldsTooLarge, "invalid-request", "the request's line and headers are too large")
	case !strings.Contains(err.Error(), "error when reading request headers"):
		p = bodyProblem(err, false, false) // fasthttp marks every head error so
	case isTimeout(err):
		p = headTimeoutProblem()
	default:
		p = problem.New(http.StatusBadRequest, "invalid-request", "the request could not be parsed as HTTP/1.1: "+truncate(headParseError(err)))
	}
	c.Response.Reset()
	c.SetStatusCode(p.Status)
	c.SetContentType(problem.ContentType)
	c.SetBody(p.Body())
	c.SetConnectionClose()
}

// headTimeoutProblem is the answer to a request whose head did not arrive
// within HeaderTimeout.
func headTimeoutProblem() *problem.Error {
	return problem.New(http.StatusRequestTimeout, "invalid-request", "the request's line and headers did not arrive in time")
}

// headParseError is fasthttp's reason for refusing a head, without the
// copy of the head its message carries.
func headParseError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "error when reading request headers: ")
	msg, _, _ = strings.Cut(msg, ": buffer size=")
	return msg
}

// slogPrinter adapts a slog.Logger to fasthttp's Logger, at debug level:
// what fasthttp logs is a client's connection failing.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Printf(format string, args ...any) {
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("gate connection", "error", strings.TrimSpace(fmt.Sprintf(format, args...)))
	}
}

// decisionHeader is the subset of a request's headers decide reads, as an
// http.Header: Connection, Upgrade, Destination, the fencing headers, and
// any that an upstream might take for a method or path override; nil when
// there are none. into, when not nil, is cleared and filled instead of a
// new map (an event loop reuses one).
func decisionHeader(h *fasthttp.RequestHeader, into http.Header) http.Header {
	out := into
	clear(out)
	for k, v := range h.All() {
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
	if len(k) < len("x-http-method") || (k[0] != 'X' && k[0] != 'x') {
		return false
	}
	return true // overrideHeader decides, on the normalized name
}
