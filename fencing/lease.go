package fencing

import (
	"encoding/json"
	"time"
)

// Lease is a live lease: Owner holds Resource with Token until ExpiresAt.
// Times are judged by the store's clock, never by the client's.
type Lease struct {
	Resource   string
	Owner      string
	Token      Token
	TTL        time.Duration
	AcquiredAt time.Time
	ExpiresAt  time.Time
}

// Ending says how a lease ended.
type Ending string

// The ways a lease ends.
const (
	// EndReleased: the holder released it (a clean handoff).
	EndReleased Ending = "released"
	// EndExpired: it was not renewed in time (a crash, a pause, a
	// partition): the next holder validates partial state before resuming.
	EndExpired Ending = "expired"
)

// Previous describes the most recent lease on a resource that has ended.
type Previous struct {
	Owner    string
	Token    Token
	Ended    Ending
	Finished bool // the holder released with finished=true
}

// CheckpointInfo describes a stored checkpoint without its state.
type CheckpointInfo struct {
	Token     Token // the token of the holder that saved it
	UpdatedAt time.Time
	SizeBytes int
}

// Checkpoint is the last progress state saved by a holder of the resource,
// and how the holder before the current one (or the last one, if none is
// live) left.
type Checkpoint struct {
	State     json.RawMessage
	Token     Token
	UpdatedAt time.Time
	Previous  *Previous
}

// Status is everything known about a resource. An unknown resource has zero
// tokens and nil members.
type Status struct {
	Resource   string
	Issued     Token // the newest token issued
	HighWater  Token // the newest token admitted for a write
	Lease      *Lease
	Previous   *Previous
	Checkpoint *CheckpointInfo
}

// Admission is the outcome of a successful admission check.
type Admission struct {
	Resource  string
	Token     Token
	HighWater Token // the high-water mark after the check (== Token)
	Issued    Token
	Raised    bool // the check raised the high-water mark
}
