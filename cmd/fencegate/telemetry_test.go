package main

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/syncbuf"
)

// TestOTLPExporterList: OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER are
// read as the specification's comma-separated lists: OTLP is exported only
// when the list names otlp (or is unset) and an endpoint is set, and names
// fencegate does not have are reported, not taken for otlp.
func TestOTLPExporterList(t *testing.T) {
	const endpoint = "http://127.0.0.1:4318"
	for _, tc := range []struct {
		signal, value string // value "-": unset
		endpoint      bool
		want          bool
		unknown       []string
	}{
		{"TRACES", "-", true, true, nil},
		{"TRACES", "-", false, false, nil},
		{"TRACES", "", true, true, nil},
		{"TRACES", "otlp", true, true, nil},
		{"TRACES", " OTLP ", true, true, nil},
		{"TRACES", "none", true, false, nil},
		{"TRACES", "zipkin", true, false, []string{"zipkin"}},
		{"TRACES", "otlp,console", true, true, []string{"console"}},
		{"TRACES", "otlp,,", true, true, nil},
		{"TRACES", "prometheus", true, false, []string{"prometheus"}},
		{"METRICS", "prometheus", true, false, nil},
		{"METRICS", "prometheus,otlp", true, true, nil},
		{"METRICS", "otlp", false, false, nil},
	} {
		env := map[string]string{}
		if tc.value != "-" {
			env["OTEL_"+tc.signal+"_EXPORTER"] = tc.value
		}
		if tc.endpoint {
			env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
		}
		if got := otlpEnabled(env, tc.signal); got != tc.want {
			t.Errorf("%s_EXPORTER=%q, endpoint %v: OTLP export %v, want %v", tc.signal, tc.value, tc.endpoint, got, tc.want)
		}
		if _, unknown := exporters(env, tc.signal); !slices.Equal(unknown, tc.unknown) {
			t.Errorf("%s_EXPORTER=%q: unknown %q, want %q", tc.signal, tc.value, unknown, tc.unknown)
		}
	}
	env := map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
	if otlpEnabled(env, "TRACES") {
		t.Error("OTLP export with OTEL_SDK_DISABLED=true")
	}
}

// TestUnknownExporterIsLogged: an exporter name fencegate does not have is
// logged at start-up as a warning naming it.
func TestUnknownExporterIsLogged(t *testing.T) {
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	tel, err := newTelemetry(context.Background(), []string{"OTEL_TRACES_EXPORTER=zipkin", "OTEL_METRICS_EXPORTER=prometheus"}, log)
	if err != nil {
		t.Fatal(err)
	}
	tel.shutdown(log)
	out := logs.String()
	if !strings.Contains(out, "OTEL_TRACES_EXPORTER names exporters") || !strings.Contains(out, "ignored=zipkin") {
		t.Errorf("no warning naming zipkin:\n%s", out)
	}
	if strings.Contains(out, "OTEL_METRICS_EXPORTER") {
		t.Errorf("prometheus, a known metrics exporter, was warned about:\n%s", out)
	}
}
