package boltstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
)

// failMetaWrite makes the next write of a meta page by s's bbolt reach the
// page cache and then fail, as a failed flush of it does: it swaps bbolt's
// own pwrite (DB.ops.writeAt, bbolt v1.5) for one that does so.
func failMetaWrite(t *testing.T, s *Store) *atomic.Bool {
	t.Helper()
	v := reflect.ValueOf(s.db).Elem().FieldByName("ops")
	if !v.IsValid() {
		t.Fatal("bbolt's DB has no ops field: the test needs another way to fail a flush")
	}
	ops := (*struct {
		writeAt func(b []byte, off int64) (n int, err error)
	})(unsafe.Pointer(v.UnsafeAddr()))
	orig := ops.writeAt
	pageSize := int64(s.db.Info().PageSize)
	var armed atomic.Bool
	ops.writeAt = func(b []byte, off int64) (int, error) {
		n, err := orig(b, off)
		if off < 2*pageSize && armed.CompareAndSwap(true, false) {
			return n, syscall.EIO
		}
		return n, err
	}
	return &armed
}

// TestFailedCommitStopsTheStore: a commit whose meta page was written but
// whose flush failed leaves bbolt reading that page (the page cache shows
// it), so the store could go on admitting at a mark that never reached the
// disk, and after a power loss an older token would pass after a newer
// one. The caller of the failed commit is answered ErrAmbiguous; from then
// on every operation, admissions at the mark and reads included, is
// refused until the file is opened again, and the store says why.
func TestFailedCommitStopsTheStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fencegate.db")
	var logs bytes.Buffer
	opts := Options{Clock: fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)), Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	a, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "job", Owner: "a", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "a", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "job", Owner: "b", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "other", Owner: "c", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}

	failMetaWrite(t, s).Store(true)
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: b.Token}); !errors.Is(err, fencing.ErrAmbiguous) {
		t.Fatalf("Admit whose commit failed to flush: %v, want ErrAmbiguous", err)
	}
	stopped := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous) {
			t.Errorf("%s after a failed commit: %v, want ErrUnavailable (nothing done)", what, err)
		}
	}
	// The holder's retry would be admitted at the unflushed mark, with no
	// write; the older token is refused only by that mark.
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: b.Token})
	stopped("Admit at the unflushed mark", err)
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: a.Token})
	stopped("Admit of the older token", err)
	if _, ok := s.AdmitNow(fencing.AdmitRequest{Resource: "other", Token: b.Token + 1}); ok {
		t.Error("AdmitNow answered from the mark cache after a failed commit")
	}
	_, err = s.Acquire(ctx, fencing.AcquireRequest{Resource: "fresh", Owner: "d", TTL: time.Hour})
	stopped("Acquire", err)
	_, err = s.Renew(ctx, fencing.RenewRequest{Resource: "job", Owner: "b", Token: b.Token, TTL: time.Hour})
	stopped("Renew", err)
	_, err = s.Status(ctx, "job")
	stopped("Status", err)
	stopped("Ping", s.Ping(ctx))
	stopped("Backup", s.Backup(&bytes.Buffer{}))
	_, err = s.StartHolds(ctx)
	stopped("StartHolds", err)
	if !bytes.Contains(logs.Bytes(), []byte("a commit to the store file failed")) {
		t.Errorf("nothing logged of the failed commit: %q", logs.String())
	}

	// Opened again (here, with the disk as the page cache showed it), the
	// store serves.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path, opts); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "job", Token: b.Token}); err != nil {
		t.Fatalf("Admit after reopening: %v", err)
	}
}
