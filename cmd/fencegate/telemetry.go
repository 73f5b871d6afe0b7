package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/fencegate/fencegate/internal/atomichist"
)

// telemetryShutdownTimeout bounds the flush of pending spans and metrics at
// exit, so an unreachable collector cannot hold up a shutdown.
const telemetryShutdownTimeout = 5 * time.Second

// telemetry is the process's OpenTelemetry setup: a MeterProvider that the
// Prometheus exporter reads (served by metrics at GET /metrics on the API
// listener) and, when an OTLP endpoint is configured, also pushes by
// OTLP/HTTP; and a TracerProvider that exports spans by OTLP/HTTP, or a
// no-op one when no endpoint is configured.
//
// The OTLP exporters and the resource read the standard OTEL_* variables
// from the process environment themselves (endpoint, headers, timeout,
// compression, TLS, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES); environ
// only decides whether they are started.
type telemetry struct {
	// meterProvider is the SDK's, with the per-request histograms kept in
	// atomics beside it (internal/atomichist) and read by every reader.
	meterProvider  *atomichist.MeterProvider
	tracerProvider trace.TracerProvider
	metrics        http.Handler
	shutdowns      []func(context.Context) error
}

// otlpEnabled reports whether env asks for OTLP export of signal (TRACES
// or METRICS): an endpoint is set (the general one or the signal's own),
// the SDK is not disabled, and the signal's exporter list
// (OTEL_<signal>_EXPORTER, comma-separated, "otlp" when unset) names
// "otlp".
func otlpEnabled(env map[string]string, signal string) bool {
	if strings.EqualFold(env["OTEL_SDK_DISABLED"], "true") {
		return false
	}
	otlp, _ := exporters(env, signal)
	return otlp && (env["OTEL_EXPORTER_OTLP_ENDPOINT"] != "" || env["OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT"] != "")
}

// exporters reads OTEL_<signal>_EXPORTER as the OpenTelemetry
// specification defines it: a comma-separated list, "otlp" when unset.
// It reports whether the list names "otlp", and the names fencegate does
// not know, which the specification says to warn about and ignore. Known:
// "otlp", "none", and for METRICS "prometheus" (fencegate always serves
// /metrics).
func exporters(env map[string]string, signal string) (otlp bool, unknown []string) {
	v, ok := env["OTEL_"+signal+"_EXPORTER"]
	if !ok || strings.TrimSpace(v) == "" {
		return true, nil
	}
	for name := range strings.SplitSeq(v, ",") {
		switch name = strings.ToLower(strings.TrimSpace(name)); {
		case name == "otlp":
			otlp = true
		case name == "", name == "none", name == "prometheus" && signal == "METRICS":
		default:
			unknown = append(unknown, name)
		}
	}
	return otlp, unknown
}

// newTelemetry builds the providers and sets them as the OpenTelemetry
// globals (the only place fencegate does; packages get them passed in).
func newTelemetry(ctx context.Context, environ []string, log *slog.Logger) (*telemetry, error) {
	env := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "OTEL_") {
			env[k] = v
		}
	}
	res, err := resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName("fencegate"), semconv.ServiceVersion(Version())),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
	)
	if err != nil {
		if res == nil {
			return nil, fmt.Errorf("telemetry resource: %w", err)
		}
		log.Warn("telemetry resource is partial", "error", err)
	}
	// Exporter errors (a collector down, a rejected batch) go to the log,
	// not to the standard logger's stderr lines.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("telemetry export failed", "error", err)
	}))

	for _, signal := range []string{"TRACES", "METRICS"} {
		if _, unknown := exporters(env, signal); len(unknown) > 0 {
			log.Warn("OTEL_"+signal+"_EXPORTER names exporters fencegate does not have; they are ignored (known: otlp, none, and prometheus for metrics)",
				"ignored", strings.Join(unknown, ","))
		}
	}
	t := &telemetry{}
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	hists := atomichist.NewProducer()
	prom, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithProducer(hists),
		// Explicit, so names stay fencegate_gate_writes_total and
		// fencegate_store_duration_seconds whatever the exporter's default.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
		// No otel_scope_name, otel_scope_version, ... labels on every
		// series: every instrument is fencegate's own (or the HTTP
		// conventions'), so they would only multiply the label sets.
		otelprom.WithoutScopeInfo(),
	)
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       10 * time.Second,
	})
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	if otlpEnabled(env, "METRICS") {
		if protocolNotHTTP(env, "METRICS") {
			log.Warn("OTLP metrics: only http/protobuf is supported; OTEL_EXPORTER_OTLP_PROTOCOL is ignored")
		}
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP metric exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithProducer(hists))))
		log.Info("telemetry: exporting metrics by OTLP/HTTP")
	}
	t.meterProvider = &atomichist.MeterProvider{MeterProvider: sdkmetric.NewMeterProvider(mopts...), Histograms: hists}
	t.shutdowns = append(t.shutdowns, t.meterProvider.Shutdown)

	if otlpEnabled(env, "TRACES") {
		if protocolNotHTTP(env, "TRACES") {
			log.Warn("OTLP traces: only http/protobuf is supported; OTEL_EXPORTER_OTLP_PROTOCOL is ignored")
		}
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			t.shutdown(log)
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp))
		t.tracerProvider = tp
		t.shutdowns = append(t.shutdowns, tp.Shutdown)
		log.Info("telemetry: exporting traces by OTLP/HTTP")
	} else {
		t.tracerProvider = tracenoop.NewTracerProvider()
	}

	otel.SetMeterProvider(t.meterProvider)
	otel.SetTracerProvider(t.tracerProvider)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return t, nil
}

// protocolNotHTTP reports whether environ selects an OTLP protocol other
// than http/protobuf for the signal.
func protocolNotHTTP(env map[string]string, signal string) bool {
	p := env["OTEL_EXPORTER_OTLP_"+signal+"_PROTOCOL"]
	if p == "" {
		p = env["OTEL_EXPORTER_OTLP_PROTOCOL"]
	}
	return p != "" && p != "http/protobuf"
}

// shutdown flushes and stops the providers within telemetryShutdownTimeout.
func (t *telemetry) shutdown(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), telemetryShutdownTimeout)
	defer cancel()
	var errs []error
	for i := len(t.shutdowns) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdowns[i](ctx))
	}
	if err := errors.Join(errs...); err != nil {
		log.Warn("telemetry shutdown", "error", err)
	}
}
