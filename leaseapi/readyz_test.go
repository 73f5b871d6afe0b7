package leaseapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/syncbuf"
	"github.com/fencegate/fencegate/leaseapi"
)

// flakyPingStore is a real memory store whose Ping can be made to fail, as
// a store that went away would.
type flakyPingStore struct {
	*memstore.Store
	down atomic.Bool
}

func (s *flakyPingStore) Ping(ctx context.Context) error {
	if s.down.Load() {
		return errors.New("connection refused")
	}
	return s.Store.Ping(ctx)
}

// lockedBuffer is the server's log, which a test counts lines of.
type lockedBuffer struct{ syncbuf.Buffer }

func (l *lockedBuffer) count(s string) int { return strings.Count(l.String(), s) }

// TestReadyzLogsOncePerStateChange: a probe every few seconds against a
// store that is down logs one error when readiness is lost and one info
// line when it comes back, not one per probe.
func TestReadyzLogsOncePerStateChange(t *testing.T) {
	clock := newFakeClock()
	store := &flakyPingStore{Store: memstore.New(memstore.Options{Clock: clock})}
	logs := &lockedBuffer{}
	e := newEnvWith(t, clock, store, func(o *leaseapi.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	const lost, back = `"msg":"not ready`, `"msg":"ready again`
	probe := func(n, status int) {
		t.Helper()
		for range n {
			if got := e.get("/readyz").status; got != status {
				t.Fatalf("/readyz = %d, want %d", got, status)
			}
		}
	}
	probe(2, 200)
	store.down.Store(true)
	probe(5, 503)
	if got := logs.count(lost); got != 1 {
		t.Fatalf("5 failing probes logged %d errors, want 1:\n%s", got, logs.String())
	}
	if got := logs.count(`"level":"ERROR"`); got != 1 {
		t.Fatalf("%d ERROR lines, want 1:\n%s", got, logs.String())
	}
	store.down.Store(false)
	probe(3, 200)
	if got := logs.count(back); got != 1 {
		t.Fatalf("recovery logged %d times, want 1:\n%s", got, logs.String())
	}
	store.down.Store(true)
	probe(2, 503)
	if got := logs.count(lost); got != 2 {
		t.Fatalf("second outage logged %d errors in all, want 2:\n%s", got, logs.String())
	}
}

// TestReadyWithoutStore: with ReadyWithoutStore, /readyz stays 200 while
// the store is down and says so, logs the outage once all the same, and
// lease calls still fail closed; draining still answers 503.
func TestReadyWithoutStore(t *testing.T) {
	clock := newFakeClock()
	store := &flakyPingStore{Store: memstore.New(memstore.Options{Clock: clock})}
	logs := &lockedBuffer{}
	e := newEnvWith(t, clock, store, func(o *leaseapi.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		o.ReadyWithoutStore = true
	})
	if a := e.get("/readyz"); a.status != 200 || a.body["store"] != nil {
		t.Fatalf("/readyz with the store up: %d %v", a.status, a.body)
	}
	store.down.Store(true)
	for range 3 {
		if a := e.get("/readyz"); a.status != 200 || a.body["store"] != "unavailable" {
			t.Fatalf("/readyz with the store down: %d %v, want 200 saying the store is unavailable", a.status, a.body)
		}
	}
	if got := logs.count(`"msg":"not ready`); got != 1 {
		t.Fatalf("the outage was logged %d times, want once:\n%s", got, logs.String())
	}
	e.api.SetDraining()
	if a := e.get("/readyz"); a.status != 503 {
		t.Fatalf("/readyz while draining: %d, want 503", a.status)
	}
}

// TestAccessLog: with AccessLog, every API call gets one line with its
// request id, client, method, path, status and duration; health checks
// do not.
func TestAccessLog(t *testing.T) {
	clock := newFakeClock()
	logs := &lockedBuffer{}
	e := newEnvWith(t, clock, memstore.New(memstore.Options{Clock: clock}), func(o *leaseapi.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(logs, nil))
		o.AccessLog = true
	})
	e.post("/v1/leases/job:1/acquire", `{"owner":"a"}`)
	e.post("/v1/leases/job:1/acquire", `{"owner":"b"}`)
	e.get("/readyz")
	e.get("/livez")
	text := logs.String()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err == nil && m["msg"] == leaseapi.AccessMessage {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d access lines, want 2 (no health checks):\n%s", len(lines), text)
	}
	for i, want := range []float64{200, 409} {
		m := lines[i]
		if m["status"] != want || m["method"] != "POST" || m["path"] != "/v1/leases/job:1/acquire" ||
			m["request_id"] == "" || m["client"] == "" || m["duration_ms"] == nil {
			t.Errorf("access line %d: %v, want status %v and every field", i, m, want)
		}
	}
}
