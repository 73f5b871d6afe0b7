package leaseapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// instrument wraps h with otelhttp using the providers of opts (a nil one is
// a no-op, never the global one) and the W3C trace-context propagator.
func instrument(h http.Handler, opts Options) http.Handler {
	mp, tp := opts.MeterProvider, opts.TracerProvider
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	hopts := []otelhttp.Option{
		otelhttp.WithMeterProvider(mp),
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
	}
	if opts.ServerName != "" {
		hopts = append(hopts, otelhttp.WithServerName(opts.ServerName))
	}
	return otelhttp.NewHandler(h, "leaseapi", hopts...)
}

// tagRoute names the otelhttp server span "{method} {route pattern}" and
// adds http.route to its metrics once chi has routed the request. chi sets
// the pattern on its own copy of the request, which otelhttp never sees, so
// the route is handed over through the span and the otelhttp labeler in the
// context. Requests that match no route (404) carry no http.route.
func tagRoute(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		rctx := chi.RouteContext(r.Context())
		if rctx == nil {
			return
		}
		pattern := rctx.RoutePattern()
		if pattern == "" {
			return
		}
		route := attribute.String("http.route", pattern)
		span := trace.SpanFromContext(r.Context())
		span.SetName(methodName(r.Method) + " " + pattern)
		span.SetAttributes(route)
		if l, ok := otelhttp.LabelerFromContext(r.Context()); ok {
			l.Add(route)
		}
	})
}

// methodName is the method for a span name: one of the standard methods,
// or HTTP for any other, as the semantic conventions ask.
func methodName(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodTrace, http.MethodConnect:
		return m
	}
	return "HTTP"
}
