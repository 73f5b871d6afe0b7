package leaseapi_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fencegate/fencegate/fencing/memstore"
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

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

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
		t.Fatalf("5 failing probes logged %d errors, want 1:\n%s", got, logs.b.String())
	}
	if got := logs.count(`"level":"ERROR"`); got != 1 {
		t.Fatalf("%d ERROR lines, want 1:\n%s", got, logs.b.String())
	}
	store.down.Store(false)
	probe(3, 200)
	if got := logs.count(back); got != 1 {
		t.Fatalf("recovery logged %d times, want 1:\n%s", got, logs.b.String())
	}
	store.down.Store(true)
	probe(2, 503)
	if got := logs.count(lost); got != 2 {
		t.Fatalf("second outage logged %d errors in all, want 2:\n%s", got, logs.b.String())
	}
}
