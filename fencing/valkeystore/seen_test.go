package valkeystore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

func TestSeenRecordLost(t *testing.T) {
	seen := seenRecord{issued: 10, hw: 8, floor: 4}
	for _, tc := range []struct {
		known             bool
		issued, hw, floor fencing.Token
		want              bool
	}{
		{false, 1, 1, 0, false},  // never seen: nothing to compare
		{true, 10, 8, 4, false},  // the same record
		{true, 10, 0, 4, false},  // the same record, an answer without the mark
		{true, 12, 9, 4, false},  // moved on
		{true, 9, 8, 4, true},    // an issued counter never goes back on its own
		{true, 10, 6, 4, true},   // nor does a mark: the raise to 8 was lost
		{true, 12, 5, 5, true},   // another floor below tokens seen: re-created below them
		{true, 12, 0, 10, false}, // re-created at the clock, at the highest token seen: refuses it
		{true, 30, 0, 20, false}, // re-created above every token seen (after retention)
		{true, 0, 0, 0, false},   // gone (removed by retention, or lost): refused on the clock until re-created
	} {
		if got := seen.lost(tc.known, tc.issued, tc.hw, tc.floor); got != tc.want {
			t.Errorf("lost(%v, %d, %d, %d) = %v, want %v", tc.known, tc.issued, tc.hw, tc.floor, got, tc.want)
		}
	}
}

// Answers arriving out of order never move what was seen back.
func TestSeenMarksObserveKeepsNewest(t *testing.T) {
	m := newSeenMarks()
	m.observe("r", 20, 0, 3)
	m.observe("r", 15, 0, 3) // an older answer, late
	if got, _ := m.resource("r"); got.issued != 20 {
		t.Fatalf("after a late older answer: %+v", got)
	}
	m.observe("r", 20, 0, 19) // a lift: same counter, new floor
	if got, _ := m.resource("r"); got.floor != 19 {
		t.Fatalf("after a lift: %+v", got)
	}
	if m.floor() != 20 {
		t.Fatalf("top %d, want 20", m.floor())
	}
	m.observe("r", 20, 20, 19)
	m.observe("r", 20, 0, 19)  // an answer without the mark
	m.observe("r", 18, 19, 19) // an older answer, late
	if got, _ := m.resource("r"); got.hw != 20 {
		t.Fatalf("mark after answers without it or older: %+v", got)
	}
	m.observe("r", 25, 0, 24) // lifted: the mark seen was under the old floor
	if got, _ := m.resource("r"); got.hw != 0 || got.floor != 24 {
		t.Fatalf("after a lift: %+v", got)
	}
}

// A record that does not exist (issued 0) is not remembered: its creation
// by the next acquisition is not a loss.
func TestSeenMarksIgnoreAbsentRecords(t *testing.T) {
	m := newSeenMarks()
	m.observe("r", 0, 0, 0)
	if rec, known := m.resource("r"); known {
		t.Fatalf("an absent record was remembered: %+v", rec)
	}
}

// Regression: a gate that had seen a resource absent (an admission refused
// with token-not-issued, issued 0) took the record another gate then
// created (with a floor of its own) for a re-created one: its next
// acquisition lifted the record, ending the live lease and handing the
// resource to a second owner. Found by the linearizability check, where
// the two calls raced through one gate.
func TestAbsentRecordThenAcquireKeepsTheLease(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	g1, g2 := open(t, srv.URL(), prefix), open(t, srv.URL(), prefix)
	ctx := context.Background()
	if _, err := g1.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: 1 << 60}); !errors.Is(err, fencing.ErrTokenNotIssued) {
		t.Fatalf("forged admission: %v, want token-not-issued", err)
	}
	a, err := g2.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// g1 sees a later token on another resource (tokens follow the
	// server's clock), as a busy gate does.
	if _, err := g1.Acquire(ctx, fencing.AcquireRequest{Resource: "other", Owner: "c", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if b, err := g1.Acquire(ctx, fencing.AcquireRequest{Resource: "r", Owner: "b", TTL: time.Minute}); !errors.Is(err, fencing.ErrLeaseHeld) {
		t.Fatalf("second owner while %v is live: %v, %v; want lease-held", a, b, err)
	}
	if _, err := g2.Admit(ctx, fencing.AdmitRequest{Resource: "r", Token: a.Token}); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
}

func TestSeenMarksBounded(t *testing.T) {
	m := newSeenMarks()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range maxSeenResources / 4 {
				m.observe("r"+strconv.Itoa(g)+"-"+strconv.Itoa(i), fencing.Token(i+1), 0, 0)
			}
		})
	}
	wg.Wait()
	m.mu.Lock()
	n, order := len(m.byRes), len(m.order)
	m.mu.Unlock()
	if n != maxSeenResources || order != maxSeenResources {
		t.Fatalf("%d entries (%d in order), want the bound %d", n, order, maxSeenResources)
	}
	if m.floor() != maxSeenResources/4 {
		t.Fatalf("top %d, want %d", m.floor(), maxSeenResources/4)
	}
}
