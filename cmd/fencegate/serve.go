package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/pgstore"
	"github.com/fencegate/fencegate/fencing/storemetrics"
	"github.com/fencegate/fencegate/fencing/valkeystore"
	"github.com/fencegate/fencegate/internal/canned"
	"github.com/fencegate/fencegate/internal/certs"
	"github.com/fencegate/fencegate/internal/connlimit"
	"github.com/fencegate/fencegate/internal/logwriter"
	"github.com/fencegate/fencegate/leaseapi"
	"github.com/fencegate/fencegate/proxy"
)

// servedLogs is the log writer of the server running (serve), for an exit
// that does not return through serve (exitNow).
var servedLogs atomic.Pointer[logwriter.Writer]

// exitNow writes out the server's log lines still held (see logwriter),
// then exits the process with code. Its message (forceExitOnSecondSignal)
// goes through afterLogs, so it follows those lines.
func exitNow(code int) {
	if w := servedLogs.Load(); w != nil {
		w.Flush()
	}
	os.Exit(code)
}

// serve runs the listeners until ctx ends, then drains: /readyz turns 503,
// after DrainDelay the listeners stop accepting, in-flight requests get
// ShutdownGrace to finish, and the store is closed.
func serve(ctx context.Context, environ []string, stderr io.Writer) error {
	// SIGHUP reloads (see reloads); subscribed first, so one sent during
	// start-up is held until the reload loop runs, never ending the process.
	hup := make(chan os.Signal, 1)
	defer notifyReload(hup)()
	// A bad configuration exits 2, as check says for it; what fails from
	// here on (a port in use, a store that cannot be opened) exits 1.
	valid, err := validate(environ)
	if err != nil {
		return err
	}
	cfg := valid.cfg
	// The log's output: the gate's event loops hold it for each pass, so
	// that a pass's audit lines go out in one write (proxy.Options.LogBatch).
	logs := logwriter.New(stderr)
	defer logs.Flush()
	servedLogs.Store(logs)
	log := newLogger(cfg, logs)
	log.Info("starting fencegate", "version", Version(), "api_auth", cfg.APIToken != "" || cfg.AccessFile != "", "api_tls", cfg.APITLS(), "api_mtls", cfg.APITLSClientCA != "")
	if cfg.APIOpenBeyondLoopback() {
		log.Warn(openAPIWarning, "addr", cfg.APIAddr)
	}
	reg := &reloads{log: log}
	apiTLS, err := listenerTLS(ctx, "API_TLS", cfg.APITLSCert, cfg.APITLSKey, cfg.APITLSClientCA, cfg.TLSWatch, reg, log)
	if err != nil {
		return err
	}
	accessFile := valid.access
	if accessFile != nil {
		warnCertClients(cfg, accessFile.Policy(), log)
		log.Info("lease API access file", "file", cfg.AccessFile, "clients", len(accessFile.Policy().Clients()))
		reg.add("FENCEGATE_ACCESS_FILE "+cfg.AccessFile, func() error {
			if err := accessFile.Reload(); err != nil {
				return err
			}
			warnCertClients(cfg, accessFile.Policy(), log)
			return nil
		})
	}
	// Rules are configuration: a mistake in them stopped start-up above,
	// before telemetry and the store are set up.
	rules := valid.rules
	tel, err := newTelemetry(ctx, environ, log)
	if err != nil {
		return err
	}
	defer tel.shutdown(log)

	store, err := openStore(ctx, cfg, environ, log)
	if err != nil {
		return err
	}
	holds := fencing.CapabilitiesOf(store).Holds
	store = storemetrics.Wrap(store, tel.meterProvider, tel.tracerProvider)
	defer func() {
		if err := store.Close(); err != nil {
			log.Error("closing the store", "error", err)
		}
	}()

	api := leaseapi.NewServer(leaseapi.Options{
		Store:              store,
		Logger:             log,
		AuthToken:          cfg.APIToken,
		Access:             accessFile,
		DefaultTTL:         cfg.DefaultTTL,
		MaxCheckpointBytes: cfg.MaxCheckpointBytes,
		Metrics:            tel.metrics,
		MeterProvider:      tel.meterProvider,
		TracerProvider:     tel.tracerProvider,
		ServerName:         cfg.APIAddr,
		AccessLog:          cfg.AccessLog,
		ReadyWithoutStore:  cfg.ReadyWithoutStore,
	})
	servers := []*listener{{name: "api", addr: cfg.APIAddr, handler: api, health: isHealthCheck, log: log, cfg: cfg, tls: apiTLS}}

	var gate *proxy.Gate
	if cfg.Upstream == "" {
		log.Warn("write gate off: FENCEGATE_UPSTREAM is unset; only the lease API runs")
		if cfg.Rules != "" || cfg.RulesFile != "" {
			log.Warn("FENCEGATE_RULES / FENCEGATE_RULES_FILE are ignored while the write gate is off")
		}
	} else {
		gate, err = newGate(cfg, rules, store, holds, log, logs, tel)
		if err != nil {
			return err
		}
		if cfg.RulesFile != "" {
			warnUnendedRules(cfg.RulesFile, valid.unendedRule, log)
			reg.add("FENCEGATE_RULES_FILE "+cfg.RulesFile, func() error { return reloadRules(cfg, gate, log) })
		}
		gateTLS, err := listenerTLS(ctx, "PROXY_TLS", cfg.ProxyTLSCert, cfg.ProxyTLSKey, cfg.ProxyTLSClientCA, cfg.TLSWatch, reg, log)
		if err != nil {
			return err
		}
		servers = append(servers, &listener{name: "gate", addr: cfg.ProxyAddr, gate: gate, log: log, cfg: cfg, tls: gateTLS, onCutOff: func() { gate.LogCutOff() }})
	}

	for _, s := range servers {
		if err := s.listen(); err != nil {
			for _, started := range servers {
				started.close()
			}
			return err
		}
	}
	// The hold record is read, and this run recorded as started, only once
	// every listener is open, before any serves: a start that fails before
	// (a port in use) forwarded nothing and leaves the record as the
	// previous run left it, so the next start does not hold every resource
	// for a run that never accepted a connection, and still holds them
	// after a run that did and crashed. "listening" is logged after it, so
	// that line still means the holds are in force.
	if gate != nil {
		if err := restoreHolds(ctx, gate, cfg.Barrier == config.BarrierShared, log); err != nil {
			for _, s := range servers {
				s.close()
			}
			return err
		}
	}
	for _, s := range servers {
		log.Info("listening", "listener", s.name, "addr", s.ln.Addr().String(), "tls", s.tls != nil)
	}
	defer reg.run(ctx, hup)()
	var conns []proxy.ConnCount
	for _, s := range servers {
		if c, ok := s.connCount(); ok {
			conns = append(conns, c)
		}
	}
	if err := proxy.ObserveConnections(tel.meterProvider, conns...); err != nil {
		log.Warn("connections gauge", "error", err)
	}
	if gate != nil {
		if err := proxy.ObserveWritesInFlight(tel.meterProvider, gate); err != nil {
			log.Warn("writes in flight gauge", "error", err)
		}
	}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errc <- s.serve() }()
	}

	select {
	case <-ctx.Done():
	case err := <-errc:
		log.Error("listener failed", "error", err)
		stopBy := time.Now().Add(cfg.ShutdownGrace + gateCloseTimeout)
		shutdown(servers, cfg.ShutdownGrace, stopBy, log)
		if gate != nil {
			closeGate(gate, stopBy, log)
		}
		return err
	}

	log.Info("draining", "drain_delay", cfg.DrainDelay.String(), "shutdown_grace", cfg.ShutdownGrace.String())
	api.SetDraining()
	time.Sleep(cfg.DrainDelay)
	// Exit 0 even when requests were cut off: the drain was bounded by
	// design, and the cut-off is logged above.
	stopBy := time.Now().Add(cfg.ShutdownGrace + gateCloseTimeout)
	cutOff := shutdown(servers, cfg.ShutdownGrace, stopBy, log)
	if gate != nil {
		closeGate(gate, stopBy, log)
	}
	log.Info("stopped", "requests_cut_off", cutOff)
	return nil
}

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
		Handler:           overflowHandler(l.handler, l.health),
		ReadHeaderTimeout: l.cfg.ReadHeaderTimeout,
		ReadTimeout:       l.cfg.ReadHeaderTimeout + l.cfg.BodyTimeout,
		IdleTimeout:       l.cfg.IdleTimeout,
		ConnContext:       connContext,
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

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// openStore opens the configured store. environ is the injected
// environment: the postgres store takes PGPASSWORD from it.
func openStore(ctx context.Context, cfg config.Config, environ []string, log *slog.Logger) (fencing.Store, error) {
	spec, err := config.ParseStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	switch spec.Kind {
	case config.StoreMemory:
		log.Warn("memory store: leases, checkpoints and high-water marks are forgotten when fencegate stops (tokens follow the host clock, so they are not issued again unless the clock steps back). Use it for tests and demos only.")
		// Tokens on the clock, as in every store (DESIGN §12): a token
		// issued before a record was removed by retention stays refused.
		s := memstore.New(memstore.Options{MaxCheckpointBytes: cfg.MaxCheckpointBytes, Retention: cfg.Retention, ClockTokens: true})
		log.Info("store open", "store", spec.Redacted())
		return s, nil
	case config.StoreFile:
		s, err := boltstore.Open(spec.Path, boltstore.Options{MaxCheckpointBytes: cfg.MaxCheckpointBytes, Logger: log, Retention: cfg.Retention})
		if err != nil {
			return nil, fmt.Errorf("opening the file store: %w", err)
		}
		log.Info("store open", "store", spec.Redacted())
		return s, nil
	case config.StoreValkey:
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		tlsConfig, err := valkeyTLS(cfg.ValkeyCAFile)
		if err != nil {
			return nil, err
		}
		s, err := valkeystore.Open(ctx, valkeystore.Options{
			URL:                spec.URL,
			KeyPrefix:          cfg.KeyPrefix,
			MaxCheckpointBytes: cfg.MaxCheckpointBytes,
			Logger:             log,
			DialTimeout:        cfg.ValkeyDialTimeout,
			CommandTimeout:     cfg.ValkeyCommandTimeout,
			TLSConfig:          tlsConfig,
			WaitReplicas:       cfg.ValkeyWaitReplicas,
			WaitTimeout:        cfg.ValkeyWaitTimeout,
			Retention:          cfg.Retention,
		})
		if err != nil {
			return nil, fmt.Errorf("opening the valkey store %s: %w", spec.Redacted(), err)
		}
		log.Info("store open", "store", spec.Redacted())
		return s, nil
	case config.StorePostgres:
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s, err := pgstore.Open(ctx, pgstore.Options{
			URL:                spec.URL,
			Password:           envValue(environ, "PGPASSWORD"),
			Schema:             cfg.PGSchema,
			StatementTimeout:   cfg.PGStatementTimeout,
			MaxCheckpointBytes: cfg.MaxCheckpointBytes,
			Logger:             log,
			Retention:          cfg.Retention,
		})
		if err != nil {
			return nil, fmt.Errorf("opening the postgres store %s: %w", spec.Redacted(), err)
		}
		log.Info("store open", "store", spec.Redacted(), "server_version", s.ServerVersion(), "schema", s.Schema())
		return s, nil
	}
	return nil, fmt.Errorf("store kind %q not supported", spec.Kind)
}

// valkeyTLS builds the TLS settings for valkeys:// from a CA file; nil (the
// system roots) when caFile is empty.
func valkeyTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("FENCEGATE_VALKEY_CA_FILE: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("FENCEGATE_VALKEY_CA_FILE: %s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// loadRules reads and parses the write gate's route rules from
// FENCEGATE_RULES or FENCEGATE_RULES_FILE, and returns them with the text
// it parsed. An error names the variable the rules came from, and the
// file for FENCEGATE_RULES_FILE.
func loadRules(cfg config.Config) ([]proxy.Rule, string, error) {
	text, from := cfg.Rules, "FENCEGATE_RULES"
	if cfg.RulesFile != "" {
		b, err := os.ReadFile(cfg.RulesFile)
		if err != nil {
			return nil, "", fmt.Errorf("FENCEGATE_RULES_FILE: %w", err)
		}
		text, from = string(b), "FENCEGATE_RULES_FILE "+cfg.RulesFile
	}
	rules, err := proxy.ParseRules(text)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", from, err)
	}
	return rules, text, nil
}

// unendedLastRule returns the line number of text's last line when that
// line holds a rule (or what does not parse as one) without a line end
// after it, or 0: the shape reloadRules refuses.
func unendedLastRule(text string) int {
	last := text[strings.LastIndexByte(text, '\n')+1:]
	if tail, err := proxy.ParseRules(last); err != nil || len(tail) > 0 {
		return strings.Count(text, "\n") + 1
	}
	return 0
}

// warnUnendedRules logs at start-up, once, that the rules file's last rule
// (at line, 0: none; configured.unendedRule) has no line end: it is taken
// as it is now, but every reload of the file in that shape will be refused
// (reloadRules), which an operator would otherwise learn only at the first
// SIGHUP.
func warnUnendedRules(file string, line int, log *slog.Logger) {
	if line > 0 {
		log.Warn("the rules file's last rule has no line end: it is in force, but a reload (SIGHUP) of the file in this shape will be refused; end every line with a newline",
			"file", file, "line", line)
	}
}

// reloadRules re-reads FENCEGATE_RULES_FILE into gate (SIGHUP): rules that
// do not load leave the ones in force, and the error names the file. Two
// shapes of a file caught while it is rewritten in place are refused too:
//
//   - one with no rules at all while rules are in force: far more often a
//     file truncated and not yet written than a wish to drop every rule,
//     which would also turn on the Fencing-Resource header's fallback
//     (FENCEGATE_RESOURCE_HEADER unset) and let clients name their writes'
//     resources. A restart drops them all.
//   - one whose last rule's line has no line end: a file cut off inside a
//     line may still parse, its last rule then another rule than the one
//     written ("fence job:{id}:data" read as "fence job:{id}", a write
//     fenced on another resource; "fence strict job:{id}" as "fence st",
//     no longer strict). Start-up, which reads a file that is not
//     being written, takes such a file as it is, with a warning
//     (warnUnendedRules).
func reloadRules(cfg config.Config, gate *proxy.Gate, log *slog.Logger) error {
	rules, text, err := loadRules(cfg)
	if err != nil {
		return err
	}
	if n := len(gate.Rules()); len(rules) == 0 && n > 0 {
		return fmt.Errorf("FENCEGATE_RULES_FILE %s holds no rules while %d are in force (a file being rewritten? replace it whole, by a rename); to run without rules, restart", cfg.RulesFile, n)
	}
	if line := unendedLastRule(text); line > 0 {
		return fmt.Errorf("FENCEGATE_RULES_FILE %s: its last rule (line %d) has no line end, as in a file cut off while it is rewritten; end every line with a newline and replace the file whole, by a rename", cfg.RulesFile, line)
	}
	if err := gate.SetRules(rules); err != nil {
		return err
	}
	log.Info("write gate rules reloaded", "file", cfg.RulesFile, "rules", len(rules))
	return nil
}

// newGate builds the write gate from the configuration and its parsed rules;
// holds, when the store has the capability, keeps barrier holds across
// restarts; logs, the logger's output, gathers the audit lines of each of
// the event loops' passes when there are audit lines.
func newGate(cfg config.Config, rules []proxy.Rule, store fencing.Store, holds fencing.HoldRecorder, log *slog.Logger, logs *logwriter.Writer, tel *telemetry) (*proxy.Gate, error) {
	upstream, err := url.Parse(cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("FENCEGATE_UPSTREAM: %w", err)
	}
	if sock, err := config.UpstreamSocket(cfg.Upstream); err == nil {
		upstream = &url.URL{Scheme: "unix", Path: sock}
	}
	resourceHeader := cfg.ResourceHeaderOn(len(rules))
	// Unset, the fallback follows the rules in force, reloads included.
	headerAlways, headerWithoutRules := cfg.ResourceHeader != nil && *cfg.ResourceHeader, cfg.ResourceHeader == nil
	log.Info("write gate", "upstream", upstream.Redacted(), "rules", len(rules), "resource_header", resourceHeader)
	if len(rules) == 0 && !resourceHeader {
		log.Warn("write gate has no rules and FENCEGATE_RESOURCE_HEADER is false: every fenced write will be refused with resource-required")
	}
	auditOff, auditSample, _ := cfg.Audit() // validated by config
	// The loops hold the log for each pass only when it gets audit lines:
	// with none, holding would gather nothing.
	var batch proxy.LogBatch
	if !auditOff && log.Enabled(context.Background(), slog.LevelInfo) {
		batch = logs
	}
	shared, gateID, err := sharedBarrier(cfg, store, log)
	if err != nil {
		return nil, err
	}
	return proxy.New(proxy.Options{
		SharedBarrier:              shared,
		GateID:                     gateID,
		Upstream:                   upstream,
		Store:                      store,
		Rules:                      rules,
		ResourceHeader:             headerAlways,
		ResourceHeaderWithoutRules: headerWithoutRules,
		Logger:                     log,
		BarrierTimeout:             cfg.BarrierTimeout,
		TimeoutGrace:               timeoutGrace(cfg.TimeoutGrace),
		BodyTimeout:                cfg.BodyTimeout,
		BodyBuffer:                 bodyBuffer(cfg.BodyBuffer),
		Holds:                      holds,
		UpstreamTimeout:            cfg.UpstreamTimeout,
		UpstreamConns:              cfg.UpstreamConns,
		UpstreamHTTP2:              cfg.UpstreamHTTP2,
		NoWriteReuse:               !cfg.UpstreamReuseWrites,
		MeterProvider:              tel.meterProvider,
		TracerProvider:             tel.tracerProvider,
		ServerName:                 cfg.ProxyAddr,
		Audit:                      proxy.Audit{Off: auditOff, Sample: auditSample, Access: cfg.AccessLog},
		LogBatch:                   batch,
	})
}

// bodyBuffer maps FENCEGATE_BODY_BUFFER, where 0 streams every body, to
// proxy.Options.BodyBuffer, where 0 means the default.
func bodyBuffer(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// envValue is the value of name in environ (KEY=VALUE pairs), or "".
func envValue(environ []string, name string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

// timeoutGrace maps FENCEGATE_TIMEOUT_GRACE, where 0 turns the grace off, to
// proxy.Options.TimeoutGrace, where 0 means the default.
func timeoutGrace(d time.Duration) time.Duration {
	if d == 0 {
		return proxy.NoGrace
	}
	return d
}

// restoreHolds applies the barrier holds the previous run left (see
// proxy.Gate.RestoreHolds). A store that cannot answer stops start-up: the
// gate would otherwise forward writes the previous run's may still race.
// With the shared barrier, a cut-off write's entry in the store outlives a
// restart until its deadline, so a store that records no holds loses
// nothing.
func restoreHolds(ctx context.Context, gate *proxy.Gate, shared bool, log *slog.Logger) error {
	r, err := gate.RestoreHolds(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("reading the barrier holds of the previous run: %w", err)
	case !r.Recorded && shared:
		log.Info("writes cut off at a stop or crash stay in the shared barrier until their entries' deadlines")
	case !r.Recorded:
		log.Warn("this store does not record barrier holds: writes cut off at a stop or crash are not held after a restart (FENCEGATE_BARRIER=shared keeps them)")
	case r.Unclean:
		log.Warn("the previous run did not record a clean stop: every resource is held for FENCEGATE_TIMEOUT_GRACE, as writes it forwarded may still be applied")
	case r.Resources > 0:
		log.Info("barrier holds restored from the previous run", "resources", r.Resources)
	}
	return nil
}

// gateCloseTimeout bounds what a stop does after the shutdown grace, all of
// it together: closing the gate's connections cut off at the grace's end
// (the work its event loops handed to goroutines), and the store's part of
// the gate's stop (removing the shared-barrier entries of the writes that
// ended, recording barrier holds). A store that does not answer holds the
// stop no longer.
const gateCloseTimeout = 10 * time.Second

// closeGate stops the gate forwarding and records its barrier holds, by
// stopBy (the shutdown grace plus gateCloseTimeout from the stop's start).
func closeGate(gate *proxy.Gate, stopBy time.Time, log *slog.Logger) {
	ctx, cancel := context.WithDeadline(context.Background(), stopBy)
	defer cancel()
	n, err := gate.Close(ctx)
	if err != nil {
		log.Error("stopping the write gate did not finish; a store that records barrier holds has the next start treat this stop as unclean", "error", err)
		return
	}
	if n > 0 {
		log.Info("barrier holds recorded for the next start", "resources", n)
	}
}
