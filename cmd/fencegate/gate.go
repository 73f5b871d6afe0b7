package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/internal/logwriter"
	"github.com/fencegate/fencegate/proxy"
)

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
