package valkeystore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
	"github.com/fencegate/fencegate/internal/syncbuf"
)

// until polls cond every 20 ms for up to 30 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1500 {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting until %s", what)
}

// TestEvictionPolicyChangedAtRuntime: a server switched to allkeys-lru
// while fencegate runs turns Ping red and fails every operation closed
// (ErrUnavailable: nothing sent), logged once; back to noeviction, it
// recovers, logged once.
func TestEvictionPolicyChangedAtRuntime(t *testing.T) {
	srv := valkeytest.Start(t)
	logs := &syncbuf.Buffer{}
	s, err := Open(context.Background(), Options{URL: srv.URL(), KeyPrefix: freshPrefix(), PolicyCheckInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l := mustAcquire(t, s, "job", "a")
	mustAdmit(t, s, "job", l.Token)

	srv.MustDo("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	until(t, "Ping fails", func() bool { return s.Ping(ctx) != nil })
	if err := s.Ping(ctx); !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("Ping with an evicting server: %v", err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: l.Token}); !errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous) {
		t.Fatalf("Admit with an evicting server: %v, want ErrUnavailable (not sent)", err)
	}
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "other", Owner: "b", TTL: time.Minute}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Acquire with an evicting server: %v", err)
	}
	if st := srv.MustDo("EXISTS", s.recKey("other")); st != "0" {
		t.Fatalf("a refused Acquire wrote its record: EXISTS %s", st)
	}
	time.Sleep(100 * time.Millisecond) // several more checks: still one log line
	if n := strings.Count(logs.String(), "may evict keys"); n != 1 {
		t.Fatalf("the eviction policy was logged %d times, want once:\n%s", n, logs)
	}

	srv.MustDo("CONFIG", "SET", "maxmemory-policy", "noeviction")
	until(t, "Ping recovers", func() bool { return s.Ping(ctx) == nil })
	mustAdmit(t, s, "job", l.Token)
	if n := strings.Count(logs.String(), "operations resume"); n != 1 {
		t.Fatalf("the recovery was logged %d times, want once:\n%s", n, logs)
	}
}
