package fencingtest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// wantNothingStored fails unless the resource is still as fresh as an
// unknown one.
func (s *suite) wantNothingStored(what, res string) {
	s.t.Helper()
	st := s.status(res)
	if st.Issued != 0 || st.HighWater != 0 || st.Lease != nil || st.Previous != nil || st.Checkpoint != nil {
		s.t.Fatalf("%s: status %+v, want nothing stored", what, st)
	}
}

// wantUntouched fails unless the resource still has exactly lease l live,
// with no checkpoint and an unmoved high-water mark.
func (s *suite) wantUntouched(what string, l fencing.Lease, highWater fencing.Token) {
	s.t.Helper()
	st := s.status(l.Resource)
	s.wantLeaseIs(what, st.Lease, l)
	if st.Issued != l.Token || st.HighWater != highWater || st.Checkpoint != nil {
		s.t.Fatalf("%s: status %+v, want issued %d, high water %d, no checkpoint", what, st, l.Token, highWater)
	}
}

func testBadResourceRefused(s *suite) {
	longest := strings.Repeat("r", fencing.MaxNameBytes)
	ok := s.acquire(longest, "alice", longTTL) // 200 bytes is within bounds
	bad := []string{"", longest + "r", "a/b", "a b", "/", "a\x00b", "caf\u00e9", "a\nb", "a%2Fb", "*"}
	for _, res := range bad {
		what := func(op string) string { return op + " with resource " + quote(res) }
		_, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: res, Owner: "alice", TTL: longTTL})
		s.wantErr(what("Acquire"), err, fencing.ErrInvalid)
		_, err = s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: 1})
		s.wantErr(what("Renew"), err, fencing.ErrInvalid)
		_, err = s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: 1})
		s.wantErr(what("Release"), err, fencing.ErrInvalid)
		_, err = s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: "alice", Token: 1, State: []byte(`1`)})
		s.wantErr(what("Checkpoint"), err, fencing.ErrInvalid)
		_, err = s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: 1})
		s.wantErr(what("Admit"), err, fencing.ErrInvalid)
		_, err = s.st.Status(s.ctx, res)
		s.wantErr(what("Status"), err, fencing.ErrInvalid)
		_, err = s.st.ReadCheckpoint(s.ctx, res)
		s.wantErr(what("ReadCheckpoint"), err, fencing.ErrInvalid)
	}
	// Nothing but the valid lease was stored.
	s.wantList("List after refused resources", s.list("", 0), ok)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func testBadOwnerRefused(s *suite) {
	const res, held = "bounds:owner", "bounds:owner:held"
	longest := strings.Repeat("o", fencing.MaxNameBytes)
	l := s.acquire(held, longest, longTTL) // 200 bytes is within bounds
	s.advance(time.Second)
	bad := []string{"", longest + "o", "a\x01b", "tab\there", "line\n", "\x7f", "caf\u00e9", " lead", "trail "}
	for _, owner := range bad {
		what := func(op string) string { return op + " with owner " + quote(owner) }
		_, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: res, Owner: owner, TTL: longTTL})
		s.wantErr(what("Acquire"), err, fencing.ErrInvalid)
		_, err = s.st.Renew(s.ctx, fencing.RenewRequest{Resource: held, Owner: owner, Token: l.Token})
		s.wantErr(what("Renew"), err, fencing.ErrInvalid)
		_, err = s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: held, Owner: owner, Token: l.Token})
		s.wantErr(what("Release"), err, fencing.ErrInvalid)
		_, err = s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: held, Owner: owner, Token: l.Token, State: []byte(`1`)})
		s.wantErr(what("Checkpoint"), err, fencing.ErrInvalid)
	}
	s.wantNothingStored("after refused owners", res)
	s.wantUntouched("held lease after refused owners", l, 0)
}

func testBadTTLRefused(s *suite) {
	const res, held = "bounds:ttl", "bounds:ttl:held"
	l := s.acquire(held, "alice", longTTL)
	s.advance(time.Second)
	for _, ttl := range []time.Duration{0, -time.Second, time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond, fencing.MaxTTL + time.Second, fencing.MaxTTL + time.Millisecond, 48 * time.Hour} {
		_, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: res, Owner: "alice", TTL: ttl})
		s.wantErr("Acquire with TTL "+ttl.String(), err, fencing.ErrInvalid)
		if ttl == 0 {
			continue // Renew with TTL 0 keeps the lease's TTL
		}
		_, err = s.st.Renew(s.ctx, fencing.RenewRequest{Resource: held, Owner: "alice", Token: l.Token, TTL: ttl})
		s.wantErr("Renew with TTL "+ttl.String(), err, fencing.ErrInvalid)
	}
	s.wantNothingStored("after refused TTLs", res)
	s.wantUntouched("held lease after refused TTLs", l, 0)
	// The bounds themselves are accepted.
	s.acquire("bounds:ttl:min", "alice", fencing.MinTTL)
	s.acquire("bounds:ttl:max", "alice", fencing.MaxTTL)
}

func testBadTokenRefused(s *suite) {
	const res = "bounds:token"
	l := s.acquire(res, "alice", longTTL)
	s.advance(time.Second)
	_, err := s.st.Renew(s.ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: 0})
	s.wantErr("Renew with token 0", err, fencing.ErrInvalid)
	_, err = s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res, Owner: "alice", Token: 0})
	s.wantErr("Release with token 0", err, fencing.ErrInvalid)
	_, err = s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: "alice", Token: 0, State: []byte(`1`)})
	s.wantErr("Checkpoint with token 0", err, fencing.ErrInvalid)
	_, err = s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: 0})
	s.wantErr("Admit with token 0", err, fencing.ErrInvalid)
	s.wantUntouched("lease after token 0 calls", l, 0)
}

// jsonString returns a JSON string value that encodes to exactly n bytes.
func jsonString(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'x'
	}
	b[0], b[n-1] = '"', '"'
	return b
}

func testCheckpointTooLarge(s *suite) {
	const res = "bounds:cp:large"
	l := s.acquire(res, "alice", longTTL)
	s.advance(time.Second)
	over := jsonString(s.maxState + 1)
	_, err := s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: "alice", Token: l.Token, State: over})
	s.wantErr("Checkpoint one byte over the limit", err, fencing.ErrTooLarge)
	_, err = s.st.ReadCheckpoint(s.ctx, res)
	s.wantErr("ReadCheckpoint after an oversized checkpoint", err, fencing.ErrNoCheckpoint)
	s.wantUntouched("lease after an oversized checkpoint", l, 0)
	// A stored checkpoint is kept when a bigger one is refused.
	c := s.checkpoint(l, `{"small":1}`)
	s.advance(time.Second)
	_, err = s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: "alice", Token: l.Token, State: jsonString(2*s.maxState + 10)})
	s.wantErr("Checkpoint twice the limit", err, fencing.ErrTooLarge)
	if cp := s.readCheckpoint(res); !sameJSON(cp.State, []byte(`{"small":1}`)) {
		s.t.Fatalf("checkpoint after a refused one %s, want the earlier state", cp.State)
	}
	s.wantLeaseIs("lease after a refused checkpoint", s.status(res).Lease, c)
	// Exactly the limit is accepted.
	s.checkpoint(l, string(jsonString(s.maxState)))
	cp := s.readCheckpoint(res)
	if len(cp.State) != s.maxState || !sameJSON(cp.State, jsonString(s.maxState)) {
		s.t.Fatalf("checkpoint of exactly the limit read back as %d bytes, want %d", len(cp.State), s.maxState)
	}
	if st := s.status(res); st.Checkpoint == nil || st.Checkpoint.SizeBytes != s.maxState {
		s.t.Fatalf("status checkpoint %+v, want %d bytes", st.Checkpoint, s.maxState)
	}
}

func testCheckpointInvalidJSON(s *suite) {
	const res = "bounds:cp:json"
	l := s.acquire(res, "alice", longTTL)
	s.advance(time.Second)
	for _, state := range []string{"", "{", "nul", `{"a":}`, "'x'", "1 2", "[1,]", "\xff", `"unterminated`} {
		_, err := s.st.Checkpoint(s.ctx, fencing.CheckpointRequest{Resource: res, Owner: "alice", Token: l.Token, State: []byte(state)})
		s.wantErr("Checkpoint with state "+quote(state), err, fencing.ErrInvalid)
	}
	_, err := s.st.ReadCheckpoint(s.ctx, res)
	s.wantErr("ReadCheckpoint after invalid checkpoints", err, fencing.ErrNoCheckpoint)
	s.wantUntouched("lease after invalid checkpoints", l, 0)
}

func testBadListRequestRefused(s *suite) {
	for _, req := range []fencing.ListRequest{{Limit: -1}, {Limit: fencing.MaxListLimit + 1}, {Prefix: "a/b"}, {Prefix: "a b"}, {Prefix: strings.Repeat("p", fencing.MaxNameBytes+1)},
		{After: "a/b"}, {After: "a\x00"}, {After: strings.Repeat("a", fencing.MaxNameBytes+1)}} {
		_, err := s.st.List(s.ctx, req)
		s.wantErr("List "+quote(req.Prefix), err, fencing.ErrInvalid)
	}
	l := s.acquire("list:max", "alice", longTTL)
	s.wantList("List with the largest limit", s.list("list:", fencing.MaxListLimit), l)
}

func testClosedStoreFailsClosed(s *suite) {
	const res = "closed:store"
	l := s.acquire(res, "alice", longTTL)
	if err := s.st.Ping(s.ctx); err != nil {
		s.t.Fatalf("Ping of an open store: %v", err)
	}
	if err := s.st.Close(); err != nil {
		s.t.Fatalf("Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	calls := map[string]func() error{
		"Acquire": func() error {
			_, err := s.st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "bob", TTL: longTTL})
			return err
		},
		"Admit": func() error {
			_, err := s.st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token})
			return err
		},
		"Renew": func() error {
			_, err := s.st.Renew(ctx, fencing.RenewRequest{Resource: res, Owner: "alice", Token: l.Token})
			return err
		},
		"Status": func() error { _, err := s.st.Status(ctx, res); return err },
		"Ping":   func() error { return s.st.Ping(ctx) },
	}
	for name, call := range calls {
		err := call()
		if !fencing.IsStoreFault(err) {
			s.t.Fatalf("%s on a closed store: %v, want a store fault (fail closed)", name, err)
		}
		if errors.Is(err, fencing.ErrStaleToken) || errors.Is(err, fencing.ErrLeaseHeld) {
			s.t.Fatalf("%s on a closed store: %v also matches a refusal", name, err)
		}
	}
}
