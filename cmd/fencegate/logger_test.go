package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/config"
)

// TestLogger: logs are JSON by default (DESIGN §7); FENCEGATE_LOG_FORMAT=text
// switches to text and FENCEGATE_LOG_LEVEL drops records below the level.
func TestLogger(t *testing.T) {
	load := func(environ ...string) config.Config {
		t.Helper()
		cfg, err := config.Load(environ)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}

	var buf bytes.Buffer
	newLogger(load(), &buf).Info("hello", "k", "v")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil || rec["msg"] != "hello" || rec["k"] != "v" || rec["level"] != "INFO" {
		t.Fatalf("default log line is not the JSON record: %q (%v)", buf.String(), err)
	}

	buf.Reset()
	log := newLogger(load("FENCEGATE_LOG_FORMAT=text", "FENCEGATE_LOG_LEVEL=warn"), &buf)
	log.Info("dropped")
	log.Warn("kept", "k", "v")
	if got := buf.String(); strings.Contains(got, "dropped") || !strings.Contains(got, `level=WARN msg=kept k=v`) {
		t.Fatalf("text logger at warn wrote %q", got)
	}

	buf.Reset()
	newLogger(load("FENCEGATE_LOG_LEVEL=debug"), &buf).Debug("detail")
	if !strings.Contains(buf.String(), `"msg":"detail"`) {
		t.Fatalf("debug level dropped a debug record: %q", buf.String())
	}
}
