package proxy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// auditLog collects the gate's JSON log lines.
type auditLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *auditLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the decoded log lines with message msg.
func (l *auditLog) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

func withLog(l *auditLog) envOpt {
	return func(o *Options) { o.Logger = slog.New(slog.NewJSONHandler(l, nil)) }
}

// wantFields checks an audit line's fields; a nil want means the field
// must be absent.
func wantFields(t *testing.T, line map[string]any, want map[string]any) {
	t.Helper()
	for k, v := range want {
		got, ok := line[k]
		switch {
		case v == nil && ok:
			t.Errorf("%s = %v, want it absent (line %v)", k, got, line)
		case v != nil && got != v:
			t.Errorf("%s = %#v, want %#v (line %v)", k, got, v, line)
		}
	}
	if id, _ := line["request_id"].(string); id == "" {
		t.Errorf("no request_id in %v", line)
	}
	if d, ok := line["duration_ms"].(float64); !ok || d < 0 {
		t.Errorf("duration_ms = %v in %v", line["duration_ms"], line)
	}
}

func TestAuditLineAdmittedAndStale(t *testing.T) {
	logs := &auditLog{}
	e := newEnv(t, testRules, withLog(logs))
	a := e.acquire("job:7", "a", 10*time.Second)
	e.clock.Advance(11 * time.Second)
	b := e.acquire("job:7", "b", 10*time.Second)

	if r := e.do("PUT", "/jobs/7", "new", HeaderToken, tok(b.Token), "X-Request-Id", "req-admitted"); r.Status != 200 {
		t.Fatalf("admitted write: %d %s", r.Status, r.Body)
	}
	wantProblem(t, e.do("PUT", "/jobs/7", "old", HeaderToken, tok(a.Token), "X-Request-Id", "req-stale"), 409, "stale-token")
	wantProblem(t, e.do("PUT", "/jobs/7", "none"), 428, "token-required")

	lines := logs.lines(t, AuditMessage)
	if len(lines) != 3 {
		t.Fatalf("%d audit lines for 3 writes:\n%s", len(lines), logs.b.String())
	}
	wantFields(t, lines[0], map[string]any{"request_id": "req-admitted", "method": "PUT", "path": "/jobs/7", "code": CodeAdmitted,
		"resource": "job:7", "token": float64(b.Token), "high_water": float64(b.Token), "issued": float64(b.Token),
		"upstream_status": float64(200), "level": "INFO"})
	wantFields(t, lines[1], map[string]any{"request_id": "req-stale", "code": "stale-token", "resource": "job:7",
		"token": float64(a.Token), "high_water": float64(b.Token), "upstream_status": nil})
	wantFields(t, lines[2], map[string]any{"code": "token-required", "resource": nil, "token": nil, "upstream_status": nil})
	if e.gate.LogCutOff() != 0 {
		t.Fatal("finished writes are still listed as in flight")
	}
}

func TestAuditLineBarrierTimeoutAndCutOff(t *testing.T) {
	logs := &auditLog{}
	e := newEnv(t, testRules, withLog(logs), func(o *Options) { o.BarrierTimeout = 20 * time.Millisecond })
	a, b, res1, release := e.slowHandoff("X-Request-Id", "req-slow")
	wantProblem(t, e.do("PUT", "/jobs/5", "two", HeaderToken, tok(b.Token), "X-Request-Id", "req-barrier"), 503, "barrier-timeout")

	// The slow write is in flight: a shutdown now would cut it off.
	if n := e.gate.LogCutOff(); n != 1 {
		t.Fatalf("LogCutOff listed %d writes, want the 1 in flight", n)
	}
	close(release)
	if r := <-res1; r.Status != 200 {
		t.Fatalf("slow write: %d", r.Status)
	}

	cut := logs.lines(t, CutOffMessage)
	if len(cut) != 1 {
		t.Fatalf("%d cut-off lines:\n%s", len(cut), logs.b.String())
	}
	wantFields(t, cut[0], map[string]any{"request_id": "req-slow", "code": "cut-off", "level": "WARN",
		"resource": "job:5", "token": float64(a.Token), "high_water": float64(a.Token), "upstream_status": nil})

	lines := logs.lines(t, AuditMessage)
	if len(lines) != 2 {
		t.Fatalf("%d audit lines for 2 writes:\n%s", len(lines), logs.b.String())
	}
	byID := map[string]map[string]any{}
	for _, l := range lines {
		byID[l["request_id"].(string)] = l
	}
	wantFields(t, byID["req-barrier"], map[string]any{"code": "barrier-timeout", "resource": "job:5",
		"token": float64(b.Token), "high_water": float64(b.Token), "upstream_status": nil})
	wantFields(t, byID["req-slow"], map[string]any{"code": CodeAdmitted, "upstream_status": float64(200)})
}

func TestAuditOffAndSampled(t *testing.T) {
	off := &auditLog{}
	e := newEnv(t, testRules, withLog(off), func(o *Options) { o.Audit.Off = true })
	l := e.acquire("job:1", "a", 10*time.Second)
	e.do("PUT", "/jobs/1", "x", HeaderToken, tok(l.Token))
	wantProblem(t, e.do("PUT", "/jobs/1", "x"), 428, "token-required")
	if n := len(off.lines(t, AuditMessage)); n != 0 {
		t.Fatalf("audit off: %d lines", n)
	}

	// A vanishing sample drops successful writes, never refusals.
	sampled := &auditLog{}
	e = newEnv(t, testRules, withLog(sampled), func(o *Options) { o.Audit.Sample = 1e-12 })
	l = e.acquire("job:1", "a", 10*time.Second)
	for range 20 {
		if r := e.do("PUT", "/jobs/1", "x", HeaderToken, tok(l.Token)); r.Status != 200 {
			t.Fatalf("write: %d", r.Status)
		}
	}
	wantProblem(t, e.do("PUT", "/jobs/1", "x"), 428, "token-required")
	lines := sampled.lines(t, AuditMessage)
	if len(lines) != 1 || lines[0]["code"] != "token-required" {
		t.Fatalf("sampled audit log: %v", lines)
	}
}
