package valkeystore

import (
	"strconv"
	"sync"
	"testing"

	"github.com/fencegate/fencegate/fencing"
)

func TestSeenRecordLost(t *testing.T) {
	seen := seenRecord{issued: 10, floor: 4}
	for _, tc := range []struct {
		known         bool
		issued, floor fencing.Token
		want          bool
	}{
		{false, 1, 0, false}, // never seen: nothing to compare
		{true, 10, 4, false}, // the same record
		{true, 12, 4, false}, // moved on
		{true, 9, 4, true},   // an issued counter never goes back on its own
		{true, 12, 5, true},  // another floor: re-created or lifted
		{true, 0, 0, true},   // gone
	} {
		if got := seen.lost(tc.known, tc.issued, tc.floor); got != tc.want {
			t.Errorf("lost(%v, %d, %d) = %v, want %v", tc.known, tc.issued, tc.floor, got, tc.want)
		}
	}
}

// Answers arriving out of order never move what was seen back.
func TestSeenMarksObserveKeepsNewest(t *testing.T) {
	m := newSeenMarks()
	m.observe("r", 20, 3)
	m.observe("r", 15, 3) // an older answer, late
	if got, _ := m.resource("r"); got.issued != 20 {
		t.Fatalf("after a late older answer: %+v", got)
	}
	m.observe("r", 20, 19) // a lift: same counter, new floor
	if got, _ := m.resource("r"); got.floor != 19 {
		t.Fatalf("after a lift: %+v", got)
	}
	if m.floor() != 20 {
		t.Fatalf("top %d, want 20", m.floor())
	}
}

func TestSeenMarksBounded(t *testing.T) {
	m := newSeenMarks()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range maxSeenResources / 4 {
				m.observe("r"+strconv.Itoa(g)+"-"+strconv.Itoa(i), fencing.Token(i+1), 0)
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
