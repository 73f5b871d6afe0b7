package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/storemetrics"
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
		// As many waiting acquisitions as the listener's caps allow
		// connections (over HTTP/2 a connection carries many streams).
		MaxWaiting:          cfg.MaxConns,
		MaxWaitingPerClient: cfg.ConnsPerClient(),
		BodyMemory:          int64(cfg.APIBodyMemory),
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
	stopReloads := reg.run(ctx, hup)
	defer stopReloads(reloadStopWait)
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
		api.EndWaits()
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
	api.EndWaits() // waiting acquisitions answered now, not cut off at the end of the grace
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

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
