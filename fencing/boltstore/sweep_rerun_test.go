package boltstore_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/fencingtest"
)

// TestSweepRerunPersistsSweptMark: a sweep call that runs again after a
// neighbour in its group failed must still write the swept mark to the
// file; otherwise, counting from one, a restart forgets it and the removed
// resource's tokens repeat.
func TestSweepRerunPersistsSweptMark(t *testing.T) {
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "fencegate.db")
	opts := boltstore.Options{Clock: clock, CountFromOne: true, Retention: time.Hour, SweepInterval: 24 * time.Hour}
	st := open(t, path, opts)
	ctx := context.Background()
	var old map[string]fencing.Token
	for range 3 {
		old = idleResources(t, st, "job:a")
	}
	clock.Advance(2 * time.Hour)

	entered, release := make(chan struct{}), make(chan struct{})
	first := true
	boltstore.SetHooks(st, func(res string) error {
		if res == "job:bad" {
			return errors.New("injected storage failure")
		}
		return nil
	}, func(int) {
		if first {
			first = false
			close(entered)
			<-release
		}
	})
	done := make(chan error, 3)
	go func() {
		_, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:blocker", Owner: "o", TTL: time.Hour})
		done <- err
	}()
	<-entered
	swept := make(chan int, 1)
	go func() {
		n, err := st.Sweep(ctx)
		swept <- n
		done <- err
	}()
	for boltstore.Queued(st) < 1 {
		time.Sleep(time.Millisecond)
	}
	go func() {
		_, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:bad", Owner: "o", TTL: time.Hour})
		if err == nil {
			err = errors.New("job:bad acquired despite the injected failure")
		} else {
			err = nil
		}
		done <- err
	}()
	for boltstore.Queued(st) < 2 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n := <-swept; n != 1 {
		t.Fatalf("swept %d, want 1 (job:a)", n)
	}
	// Before the restart the in-memory mark keeps tokens rising.
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = open(t, path, opts)
	defer st.Close()
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:a", Owner: "new", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= old["job:a"] {
		t.Fatalf("after the sweep and a restart job:a issued token %d, not above %d it issued before its removal", l.Token, old["job:a"])
	}
}
