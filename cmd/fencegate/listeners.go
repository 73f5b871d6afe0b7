package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/internal/canned"
	"github.com/fencegate/fencegate/internal/certs"
	"github.com/fencegate/fencegate/internal/connlimit"
	"github.com/fencegate/fencegate/leaseapi"
	"github.com/fencegate/fencegate/proxy"
)

// listener is one HTTP listener of the process: the lease API's (a
// net/http server) or the write gate's (proxy.Server).
type listener struct {
	name    string
	addr    string
	handler http.Handler             // the lease API; nil for the gate
	health  func(*http.Request) bool // requests served on the connections kept in reserve
	gate    *proxy.Gate              // the gate; nil for the lease API
	log     *slog.Logger
	cfg     config.Config
	ln      net.Listener
	srv     server
	tls     *certs.Source      // serve HTTPS with its certificates; nil: cleartext
	conns   *connlimit.Counter // the lease API's open connections
	// onCutOff, if set, runs when the shutdown grace ends with requests
	// still in flight, before their connections are closed.
	onCutOff func()
}

// server is what the process needs of an HTTP server: *http.Server and
// *proxy.Server.
type server interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// listen opens the listener with the slow-client bounds: a deadline for the
// headers and one for the body (counted from the end of the headers on
// the lease API; the gate moves it when it starts forwarding a request),
// an idle timeout, and a cap on concurrent connections (see connLimit for
// the lease API; the gate's server applies its own, without a reserve, as
// it serves no health checks).
func (l *listener) listen() error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return fmt.Errorf("%s listener: %w", l.name, err)
	}
	if l.gate != nil {
		l.ln = ln
		opts := proxy.ServerOptions{
			HeaderTimeout:     l.cfg.ReadHeaderTimeout,
			IdleTimeout:       l.cfg.IdleTimeout,
			MaxConns:          l.cfg.MaxConns,
			MaxConnsPerClient: l.cfg.ConnsPerClient(),
			Logger:            l.log,
			NoIOURing:         !l.cfg.IOURing,
			H2C:               l.cfg.ProxyH2C,
			NoMarkReaders:     !l.cfg.MarkReaders,
			NoTLSLoops:        !l.cfg.TLSLoops,
			Loops:             l.cfg.Loops,
			SpareProcessor:    l.cfg.SpareProcessor,
		}
		if l.tls != nil {
			opts.TLS = l.tls.TLSConfig() // HTTP/2 by ALPN; certificates re-read on SIGHUP
		}
		l.srv = proxy.NewServer(l.gate, opts)
		return nil
	}
	cl := newConnLimit(ln, l.cfg.MaxConns, healthReserve, l.cfg.ConnsPerClient())
	cl.CloseOnly = l.tls != nil // a cleartext 503 is only a handshake error to a TLS client
	l.ln, l.conns = cl, cl.Counter
	hs := &http.Server{
		Handler:           overflowHandler(l.handler, l.health, cl.Counter),
		MaxHeaderBytes:    apiMaxHeaderBytes - 4096, // net/http allows 4 KiB beyond it
		ReadHeaderTimeout: l.cfg.ReadHeaderTimeout,
		ReadTimeout:       l.cfg.ReadHeaderTimeout + l.cfg.BodyTimeout,
		IdleTimeout:       l.cfg.IdleTimeout,
		// Over TLS: streams per connection and receive windows bounded,
		// so unread request bodies cannot pile up per connection.
		HTTP2:       leaseapi.HTTP2Config(),
		ConnContext: connContext,
		// A failed handshake (no client certificate, an unknown CA) is
		// the client's problem, logged at debug by the handler's logger
		// rather than on net/http's own log.
		ErrorLog: slog.NewLogLogger(l.logger().Handler(), slog.LevelDebug),
	}
	if l.tls != nil {
		// HTTP/2 by ALPN (the Source offers h2 and http/1.1).
		hs.TLSConfig = l.tls.TLSConfig()
		l.ln = tls.NewListener(l.ln, hs.TLSConfig)
	} else {
		// A request net/http cannot read gets a problem answer, not its
		// canned plain text (see internal/canned).
		l.ln = canned.Listener{Listener: l.ln, Versions: apiVersions}
	}
	l.srv = hs
	return nil
}

// apiMaxHeaderBytes bounds a lease API request's line and headers (431
// beyond, on HTTP/1.1; on HTTP/2 the header list, as net/http applies it):
// a lease call carries a bearer token and a few small fields, and without
// a bound (net/http's default is 1 MiB) every connection allowed by the
// caps could hold a megabyte of a head that never ends, unauthenticated.
const apiMaxHeaderBytes = 16 << 10

// apiVersions is the detail of the lease API's 505 answer.
const apiVersions = "the lease API speaks HTTP/1.x (and HTTP/2 by TLS ALPN)"

// logger is the listener's logger, or one that discards.
func (l *listener) logger() *slog.Logger {
	if l.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.log
}

// connCount is the listener's connection counts, for the
// fencegate_connections gauge and fencegate_connections_refused_total.
func (l *listener) connCount() (proxy.ConnCount, bool) {
	switch srv := l.srv.(type) {
	case *proxy.Server:
		return proxy.ConnCount{Listener: l.name, Active: srv.ActiveConnections, Refused: srv.RefusedConnections}, true
	default:
		if l.conns != nil {
			return proxy.ConnCount{Listener: l.name, Active: l.conns.Active, Refused: l.conns.Refused}, true
		}
	}
	return proxy.ConnCount{}, false
}

func (l *listener) serve() error {
	if err := l.srv.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s listener: %w", l.name, err)
	}
	return nil
}

func (l *listener) close() {
	if l.ln != nil {
		l.ln.Close()
	}
}

// shutdown stops every listener at once, waiting up to grace for in-flight
// requests. Connections still busy when the grace ends are closed (the
// gate's writes among them may still be applied by the upstream); it
// reports whether any were.
func shutdown(servers []*listener, grace time.Duration, stopBy time.Time, log *slog.Logger) (cutOff bool) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for _, s := range servers {
		if s.srv == nil {
			continue
		}
		wg.Go(func() {
			if err := s.srv.Shutdown(ctx); err != nil {
				log.Error("requests still in flight at the end of the shutdown grace were cut off", "listener", s.name, "error", err)
				if s.onCutOff != nil {
					s.onCutOff()
				}
				closeServer(s.srv, stopBy)
				mu.Lock()
				cutOff = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return cutOff
}

// closeServer closes srv's connections at once. The gate's server
// (proxy.Server) then waits for the work its event loops handed to
// goroutines (a dial, an admission by a store that does not answer) no
// later than stopBy: past it, what is left forwards nothing and is logged
// once.
func closeServer(srv server, stopBy time.Time) {
	if ps, ok := srv.(*proxy.Server); ok {
		ctx, cancel := context.WithDeadline(context.Background(), stopBy)
		defer cancel()
		_ = ps.CloseContext(ctx) // logged by the server
		return
	}
	_ = srv.Close()
}
