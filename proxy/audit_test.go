package proxy

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/syncbuf"
)

// auditLog collects the gate's JSON log lines.
type auditLog struct{ syncbuf.Buffer }

// lines returns the decoded log lines with message msg.
func (l *auditLog) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
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
	if c, _ := line["client"].(string); !strings.HasPrefix(c, "127.0.0.1:") {
		t.Errorf("client = %v, want the peer's address, in %v", line["client"], line)
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
		t.Fatalf("%d audit lines for 3 writes:\n%s", len(lines), logs.String())
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
		t.Fatalf("%d cut-off lines:\n%s", len(cut), logs.String())
	}
	wantFields(t, cut[0], map[string]any{"request_id": "req-slow", "code": "cut-off", "level": "WARN",
		"resource": "job:5", "token": float64(a.Token), "high_water": float64(a.Token), "upstream_status": nil})

	// The cut-off write's warning was its one line: it gets no audit
	// line when it ends after all.
	lines := logs.lines(t, AuditMessage)
	if len(lines) != 1 {
		t.Fatalf("%d audit lines, want the barrier timeout's only:\n%s", len(lines), logs.String())
	}
	wantFields(t, lines[0], map[string]any{"request_id": "req-barrier", "code": "barrier-timeout", "resource": "job:5",
		"token": float64(b.Token), "high_water": float64(b.Token), "upstream_status": nil})
}

func TestAuditOffAndSampled(t *testing.T) {
	off := &auditLog{}
	e := newEnv(t, testRules, withLog(off), func(o *Options) { o.Audit.Off = true })
	l := e.acquire("job:1", "a", 10*time.Second)
	e.do("PUT", "/jobs/1", "x", HeaderToken, tok(l.Token))
	wantProblem(t, e.do("PUT", "/jobs/1", "x"), 428, "token-required")
	// Off silences successful writes only: a refusal is still logged.
	if lines := off.lines(t, AuditMessage); len(lines) != 1 || lines[0]["code"] != "token-required" {
		t.Fatalf("audit off: %v, want the refusal's line only", lines)
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

// TestAuditOffRefusalsRateLimited: with the audit log off, a flood of
// refused writes logs at most RefusalsPerSecond lines a second (the
// count of dropped lines is internal/loglimit's, tested there).
func TestAuditOffRefusalsRateLimited(t *testing.T) {
	logs := &auditLog{}
	e := newEnv(t, testRules, withLog(logs), func(o *Options) { o.Audit.Off = true })
	const refused = 5 * RefusalsPerSecond
	first := time.Now().Unix()
	for range refused {
		wantProblem(t, e.do("PUT", "/jobs/1", "x"), 428, "token-required")
	}
	seconds := time.Now().Unix() - first + 1 // the wall-clock seconds the flood touched
	lines := logs.lines(t, AuditMessage)
	if len(lines) == 0 || int64(len(lines)) > RefusalsPerSecond*seconds {
		t.Fatalf("%d refusal lines over %d second(s), want 1 to %d a second", len(lines), seconds, RefusalsPerSecond)
	}
}

// TestAuditTwoResourcesNamesTheRefusingOne: a COPY admitted on its source
// and refused on its destination is logged under the destination, with
// the token checked there, as its answer says.
func TestAuditTwoResourcesNamesTheRefusingOne(t *testing.T) {
	logs := &auditLog{}
	e := newEnv(t, "PUT,COPY,MOVE /files/{name} fence file:{name}", withLog(logs))
	e.acquire("file:S", "a", 10*time.Second) // token 1, S sorts first
	e.acquire("file:X", "old", time.Second)
	e.clock.Advance(2 * time.Second)
	x := e.acquire("file:X", "new", 10*time.Second)
	if r := e.do("PUT", "/files/X", "new", HeaderToken, tok(x.Token)); r.Status != 200 {
		t.Fatalf("PUT: %d %s", r.Status, r.Body)
	}
	r := e.do("COPY", "/files/S", "", HeaderToken, "1", HeaderDestination, "/files/X", HeaderDestinationToken, "1",
		"X-Request-Id", "req-copy")
	wantProblem(t, r, 409, "stale-token")
	if r.Problem["resource"] != "file:X" {
		t.Fatalf("the answer names %v, want file:X", r.Problem["resource"])
	}
	var line map[string]any
	for _, l := range logs.lines(t, AuditMessage) {
		if l["request_id"] == "req-copy" {
			line = l
		}
	}
	if line == nil {
		t.Fatalf("no audit line for the COPY:\n%s", logs.String())
	}
	wantFields(t, line, map[string]any{"code": "stale-token", "resource": "file:X", "token": float64(1),
		"high_water": float64(x.Token)})
}

// TestAccessLineForReads: with Audit.Access a read gets one access line
// (writes keep their audit line); without it, none.
func TestAccessLineForReads(t *testing.T) {
	for _, access := range []bool{false, true} {
		logs := &auditLog{}
		e := newEnv(t, testRules, withLog(logs), func(o *Options) { o.Audit.Access = access })
		if r := e.do("GET", "/jobs/1", "", "X-Request-Id", "req-read"); r.Status != 200 {
			t.Fatalf("read: %d", r.Status)
		}
		wantProblem(t, e.do("PUT", "/jobs/1", "x"), 428, "token-required")
		lines := logs.lines(t, AccessMessage)
		if !access {
			if len(lines) != 0 {
				t.Fatalf("access log off: %v", lines)
			}
			continue
		}
		if len(lines) != 1 {
			t.Fatalf("%d access lines, want the read's:\n%s", len(lines), logs.String())
		}
		wantFields(t, lines[0], map[string]any{"request_id": "req-read", "method": "GET", "path": "/jobs/1",
			"status": float64(200), "code": nil})
		if n := len(logs.lines(t, AuditMessage)); n != 1 {
			t.Fatalf("%d audit lines, want the write's", n)
		}
	}
}

// TestAuditSetUnderManyGoroutines adds and removes records from many
// goroutines at once (run it under -race) and checks that the set lists
// exactly the records still in it, whatever shard each landed in.
func TestAuditSetUnderManyGoroutines(t *testing.T) {
	var s auditSet
	const workers, each = 16, 500
	kept := make([][]*auditRecord, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				rec := &auditRecord{start: time.Now(), id: fmt.Sprintf("%d-%d", w, i)}
				s.add(rec)
				if i%3 == 0 {
					kept[w] = append(kept[w], rec)
					continue
				}
				s.remove(rec)
				s.remove(rec) // a second removal changes nothing
			}
		})
	}
	wg.Wait()
	want := map[string]bool{}
	for _, recs := range kept {
		for _, r := range recs {
			want[r.id] = true
		}
	}
	got := s.list()
	if len(got) != len(want) || s.len() != len(want) {
		t.Fatalf("set lists %d records, counts %d, want %d", len(got), s.len(), len(want))
	}
	for _, r := range got {
		if !want[r.id] {
			t.Fatalf("set lists %s, which was removed", r.id)
		}
		delete(want, r.id)
	}
	for _, recs := range kept {
		for _, r := range recs {
			s.remove(r)
		}
	}
	if n := s.len(); n != 0 || len(s.list()) != 0 {
		t.Fatalf("after removing every record the set counts %d", n)
	}
}

// BenchmarkAuditSet is a write's registration as in flight, added and
// removed, from as many goroutines as GOMAXPROCS (the event loops).
func BenchmarkAuditSet(b *testing.B) {
	var s auditSet
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec := &auditRecord{start: time.Now()}
			s.add(rec)
			s.remove(rec)
		}
	})
}
