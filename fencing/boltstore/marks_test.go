package boltstore

import (
	"testing"

	"github.com/fencegate/fencegate/fencing/record"
)

// TestMarksPublishOnlyCommittedState: the mark cache shows a record only
// once its write transaction committed, never an older one over a newer,
// and forgets a record whose commit failed.
func TestMarksPublishOnlyCommittedState(t *testing.T) {
	var m marks
	hw := func(want int) {
		t.Helper()
		e, ok := m.get("r")
		switch {
		case want < 0 && ok:
			t.Fatalf("cached high water %d, want nothing cached", e.rec.HighWater)
		case want >= 0 && !ok:
			t.Fatalf("nothing cached, want high water %d", want)
		case want >= 0 && int(e.rec.HighWater) != want:
			t.Fatalf("cached high water %d, want %d", e.rec.HighWater, want)
		}
	}
	last := &record.Lease{Owner: "a", Token: 5}
	m.saving("r", &record.Record{Issued: 5, HighWater: 5, Last: last}, 10)
	hw(-1) // pending: readers read the file
	m.settled("r", 10, true)
	hw(5)
	last.Token = 99 // the cache holds its own copy
	if e, _ := m.get("r"); e.rec.Last.Token != 5 {
		t.Fatalf("cached last token %d, want 5", e.rec.Last.Token)
	}

	// Transaction 11 saves, 12 saves and settles, then 11 settles late:
	// 12's record stays.
	m.saving("r", &record.Record{Issued: 6, HighWater: 6}, 11)
	m.saving("r", &record.Record{Issued: 7, HighWater: 7}, 12)
	m.settled("r", 12, true)
	m.settled("r", 11, true)
	hw(7)

	// A failed commit forgets the resource.
	m.saving("r", &record.Record{Issued: 8, HighWater: 8}, 13)
	hw(-1)
	m.settled("r", 13, false)
	hw(-1)
	m.saving("r", &record.Record{Issued: 8, HighWater: 8}, 14)
	m.settled("r", 14, true)
	hw(8)
}

// TestMarksBounded: past maxMarks resources, new ones are not cached; the
// cached ones still follow their writes.
func TestMarksBounded(t *testing.T) {
	var m marks
	for i := range maxMarks + 10 {
		name := string(rune('a'+i%26)) + string(rune(i))
		m.saving(name, &record.Record{Issued: 1}, i)
		m.settled(name, i, true)
	}
	if n := len(m.entries); n != maxMarks {
		t.Fatalf("%d entries, want %d", n, maxMarks)
	}
}
