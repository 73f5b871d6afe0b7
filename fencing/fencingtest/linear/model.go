// Package linear checks that a fencing.Store is linearizable per resource,
// the way Jepsen checks lock services: N concurrent clients run random
// operations on a few resources, every call and its answer (or its lack of
// one) is recorded with its real-time interval, and Porcupine
// (github.com/anishathalye/porcupine) searches for a sequential order of the
// history that a plain model of one resource, written from DESIGN §1–2,
// accepts. A store passes when such an order exists for every resource.
//
// The model (State, Step) is a second, independent implementation of the
// lease state machine: it shares no code with fencing/record, so a bug
// common to every embedded store is not also in the oracle.
//
// # Time
//
// Expiry is judged by the store's clock, so whether an operation sees a
// lease as live depends on when the store ran it. The history records the
// store's clock around every call (Options.Now: the fake clock of the memory
// and file stores, the host's wall clock for stores whose server runs on
// this host, such as the throwaway Valkey servers of the tests) and keeps
// the store's own timestamps from every answer (acquired_at, expires_at,
// updated_at). The model tracks a lease's expiry as an interval of possible
// instants, pinned to the exact value as soon as an answer shows it; an
// operation that ran somewhere in [call, return] sees the lease live if it
// expires after return, expired if it expired by call, and either (both
// branches are explored) when the expiry falls inside the interval. Leases
// therefore do expire during a history, under concurrency. The relaxation:
// the instant chosen for one operation is not forced to be consistent with
// the instants chosen for the operations ordered around it. That matters
// only while an expiry is not pinned (after a call whose answer was lost
// extended a lease, until an answer shows the lease again): each call's
// view of liveness is then judged on its own within the possible interval.
//
// # Faults
//
// An operation that failed with fencing.ErrAmbiguous may have taken effect
// at any time after its call, or never: it is recorded as pending (its
// return is after every other event) and the model lets it take effect, with
// every outcome the store could have produced, or not at all. One that
// failed with fencing.ErrUnavailable was not performed, and the model holds
// the store to that. Nothing is dropped from a history.
//
// # Tokens
//
// A store gives a new lease issued+1 (memory, file, PostgreSQL), or any token
// above issued (Options.SkipTokens: the Valkey store follows the server's
// clock in µs). With SkipTokens, a new lease whose answer was lost could
// carry any larger token: the model tries every token that answers show for
// the resource and that no answer had shown before the call, and issued+1
// to stand for a token never seen. This is exact for the workload of this
// package, which in that mode presents only tokens seen in answers, or
// forged ones far above any issued: every token never seen then compares
// alike with everything the clients present.
package linear

import (
	"fmt"
	"math"

	"github.com/fencegate/fencegate/fencing"
)

// Kind names an operation of fencing.Store.
type Kind uint8

// The operations the model covers (List is not: it spans resources).
const (
	Acquire Kind = iota
	Renew
	Release
	Checkpoint
	ReadCheckpoint
	Status
	Admit
)

var kindNames = [...]string{"acquire", "renew", "release", "checkpoint", "read-checkpoint", "status", "admit"}

func (k Kind) String() string { return kindNames[k] }

// Input is one call: its arguments and the store's clock when it was made.
type Input struct {
	Kind        Kind
	Resource    string
	Owner       string
	Token       fencing.Token
	TTL         int64 // ms; for Renew 0 keeps the lease's TTL
	Finished    bool
	RequireLive bool
	State       string // checkpoint state (JSON)
	Call        int64  // store clock (Unix ms) just before the call
	// Candidates are the tokens a pending Acquire may have issued beyond
	// issued+1 (SkipTokens only); filled in by the checker.
	Candidates []fencing.Token
}

// Result classifies an answer.
type Result uint8

// The kinds of answers.
const (
	OK          Result = iota // the store answered with success
	Refused                   // the store answered with a refusal (Output.Refusal)
	Ambiguous                 // no answer: may or may not have taken effect
	Unavailable               // not performed
)

// Refusal is the sentinel a refused call matched.
type Refusal uint8

// Refusals, one per sentinel of fencing the covered operations answer.
const (
	NoRefusal Refusal = iota
	LeaseHeld
	LeaseLost
	StaleToken
	TokenNotIssued
	LeaseNotHeld
	NoCheckpoint
)

var refusalNames = [...]string{"-", "lease-held", "lease-lost", "stale-token", "token-not-issued", "lease-not-held", "no-checkpoint"}

func (r Refusal) String() string { return refusalNames[r] }

// LeaseView is a lease as a store answered it (times in Unix ms).
type LeaseView struct {
	Owner    string
	Token    fencing.Token
	TTL      int64
	Acquired int64
	Expires  int64
}

// PrevView is how a lease ended, as answered.
type PrevView struct {
	Owner    string
	Token    fencing.Token
	Ended    fencing.Ending
	Finished bool
}

// Output is one answer and the store's clock when it came back.
type Output struct {
	Result  Result
	Refusal Refusal
	Return  int64 // store clock (Unix ms) just after the answer

	Lease    LeaseView // Acquire, Renew, Checkpoint; Status when HasLease
	Released bool      // Release

	Holder    string        // LeaseHeld
	HeldUntil int64         // LeaseHeld
	Mark      fencing.Token // StaleToken: the high-water mark; TokenNotIssued: issued

	Issued    fencing.Token // Status, Admit
	HighWater fencing.Token // Status, Admit
	Raised    bool          // Admit
	HasLease  bool          // Status
	HasPrev   bool          // Status, ReadCheckpoint
	Prev      PrevView
	HasCP     bool          // Status
	CPToken   fencing.Token // Status, ReadCheckpoint
	CPUpdated int64         // Status, ReadCheckpoint
	CPSize    int           // Status
	CPState   string        // ReadCheckpoint
}

// never is the upper bound of an instant nothing bounds (a pending call's
// return).
const never = math.MaxInt64 / 4

// lease is the most recent lease of a resource: live, expired or released.
// Times are intervals of possible store instants (Unix ms), equal bounds
// once an answer showed the value.
type lease struct {
	Owner        string
	Token        fencing.Token
	TTL          int64
	AcqLo, AcqHi int64
	ExpLo, ExpHi int64
	Released     bool
	Finished     bool
}

// State is the model of one resource (DESIGN §1–2): the newest issued
// token, the high-water mark, the most recent lease, how the lease before it
// ended, and the last checkpoint. It is comparable with ==.
type State struct {
	Issued    fencing.Token
	HighWater fencing.Token

	HasLast bool
	Last    lease

	HasPrior bool
	Prior    PrevView

	HasCP      bool
	CPToken    fencing.Token
	CPLo, CPHi int64
	CPState    string

	skipTokens bool // tokens may skip ahead (Options.SkipTokens)
}

// NewState is a resource nobody has used.
func NewState(skipTokens bool) State { return State{skipTokens: skipTokens} }

// liveness returns the possible answers to "is the most recent lease live
// at the instant the call ran", for a call that ran within [call, ret].
func (s State) liveness(call, ret int64) []bool {
	switch {
	case !s.HasLast || s.Last.Released:
		return []bool{false}
	case s.Last.ExpHi <= call: // expired by the call
		return []bool{false}
	case s.Last.ExpLo > ret: // expires after the return
		return []bool{true}
	}
	return []bool{true, false}
}

// previous is how the most recent ended lease ended, given whether the
// last lease is live.
func (s State) previous(live bool) (PrevView, bool) {
	if s.HasLast && !live {
		return s.ended(), true
	}
	return s.Prior, s.HasPrior
}

func (s State) ended() PrevView {
	e := fencing.EndExpired
	if s.Last.Released {
		e = fencing.EndReleased
	}
	return PrevView{Owner: s.Last.Owner, Token: s.Last.Token, Ended: e, Finished: s.Last.Finished}
}

// within reports lo <= v <= hi.
func within(v, lo, hi int64) bool { return lo <= v && v <= hi }

// Step applies one call and its answer to s and returns every state the
// resource may be in afterwards; none when the answer is impossible from s.
// It never modifies s.
func Step(s State, in Input, out Output) []State {
	if out.Result == Unavailable {
		return []State{s} // not performed: nothing changed
	}
	pending := out.Result == Ambiguous
	ret := out.Return
	if pending {
		ret = never
	}
	var next []State
	add := func(ns ...State) {
		for _, n := range ns {
			dup := false
			for _, x := range next {
				if x == n {
					dup = true
					break
				}
			}
			if !dup {
				next = append(next, n)
			}
		}
	}
	if pending {
		add(s) // it may never have run
	}
	choices := s.liveness(in.Call, ret)
	if !needsLiveness(s, in) {
		choices = choices[:1]
	}
	for _, live := range choices {
		add(stepAt(s, live, in, out, pending, ret)...)
	}
	return next
}

// needsLiveness reports whether the call's effect can depend on whether
// the lease is live.
func needsLiveness(s State, in Input) bool {
	switch in.Kind {
	case Admit:
		return in.RequireLive
	case ReadCheckpoint:
		return s.HasCP
	case Renew, Checkpoint:
		return s.HasLast && s.Last.Owner == in.Owner && s.Last.Token == in.Token
	}
	return true
}

// stepAt applies the call with the lease's liveness decided. For a pending
// call it returns the states after the call took effect (with every answer
// it may have had); otherwise the state after it when out is the answer the
// model gives, or nothing.
func stepAt(s State, live bool, in Input, out Output, pending bool, ret int64) []State {
	call := in.Call
	switch in.Kind {
	case Acquire:
		if live && s.Last.Owner != in.Owner {
			if pending {
				return nil // a refusal changes nothing: covered by "never ran"
			}
			if out.Result != Refused || out.Refusal != LeaseHeld || out.Holder != s.Last.Owner || !within(out.HeldUntil, s.Last.ExpLo, s.Last.ExpHi) {
				return nil
			}
			s.Last.ExpLo, s.Last.ExpHi = out.HeldUntil, out.HeldUntil
			return []State{s}
		}
		if live { // the same owner: extended, same token
			s.Last.TTL = in.TTL
			if pending {
				s.Last.ExpLo, s.Last.ExpHi = call+in.TTL, never
				return []State{s}
			}
			return s.answerLease(out, call, ret, in.TTL)
		}
		if s.HasLast {
			s.HasPrior, s.Prior = true, s.ended()
		}
		s.HasLast = true
		s.Last = lease{Owner: in.Owner, TTL: in.TTL}
		if pending {
			s.Last.AcqLo, s.Last.AcqHi = call, never
			s.Last.ExpLo, s.Last.ExpHi = call+in.TTL, never
			var out []State
			for _, tok := range s.newTokens(in.Candidates) {
				n := s
				n.Issued, n.Last.Token = tok, tok
				out = append(out, n)
			}
			return out
		}
		if out.Result != OK || out.Lease.Owner != in.Owner || out.Lease.TTL != in.TTL {
			return nil
		}
		tok := out.Lease.Token
		if tok <= s.Issued || (!s.skipTokens && tok != s.Issued+1) {
			return nil
		}
		if !within(out.Lease.Acquired, call, ret) || out.Lease.Expires != out.Lease.Acquired+in.TTL {
			return nil
		}
		s.Issued, s.Last.Token = tok, tok
		s.Last.AcqLo, s.Last.AcqHi = out.Lease.Acquired, out.Lease.Acquired
		s.Last.ExpLo, s.Last.ExpHi = out.Lease.Expires, out.Lease.Expires
		return []State{s}

	case Renew, Checkpoint:
		holds := live && s.Last.Owner == in.Owner && s.Last.Token == in.Token
		if !holds {
			if pending || out.Result != Refused || out.Refusal != LeaseLost {
				return nil
			}
			return []State{s}
		}
		if in.Kind == Renew && in.TTL != 0 {
			s.Last.TTL = in.TTL
		}
		if in.Kind == Checkpoint {
			s.HasCP, s.CPToken, s.CPState = true, in.Token, in.State
			s.CPLo, s.CPHi = call, ret
		}
		if pending {
			s.Last.ExpLo, s.Last.ExpHi = call+s.Last.TTL, never
			return []State{s}
		}
		next := s.answerLease(out, call, ret, s.Last.TTL)
		if in.Kind == Checkpoint && len(next) == 1 {
			// The checkpoint and the renewal are one step: same instant.
			upd := next[0].Last.ExpLo - next[0].Last.TTL
			next[0].CPLo, next[0].CPHi = upd, upd
		}
		return next

	case Release:
		holds := live && s.Last.Owner == in.Owner && s.Last.Token == in.Token
		switch {
		case holds:
			s.Last.Released, s.Last.Finished = true, in.Finished
			if pending || out.Result == OK && out.Released {
				return []State{s}
			}
		case s.HasLast && s.Last.Owner == in.Owner && s.Last.Token == in.Token && s.Issued == in.Token:
			if !pending && out.Result == OK && !out.Released {
				return []State{s}
			}
		default:
			if !pending && out.Result == Refused && out.Refusal == LeaseLost {
				return []State{s}
			}
		}
		return nil

	case ReadCheckpoint:
		if pending {
			return nil // reads change nothing: covered by "never ran"
		}
		if !s.HasCP {
			if out.Result == Refused && out.Refusal == NoCheckpoint {
				return []State{s}
			}
			return nil
		}
		prev, hasPrev := s.previous(live)
		if out.Result != OK || out.CPState != s.CPState || out.CPToken != s.CPToken || !within(out.CPUpdated, s.CPLo, s.CPHi) ||
			out.HasPrev != hasPrev || (hasPrev && out.Prev != prev) {
			return nil
		}
		s.CPLo, s.CPHi = out.CPUpdated, out.CPUpdated
		return []State{s}

	case Status:
		if pending {
			return nil
		}
		prev, hasPrev := s.previous(live)
		if out.Result != OK || out.Issued != s.Issued || out.HighWater != s.HighWater || out.HasLease != live ||
			out.HasPrev != hasPrev || (hasPrev && out.Prev != prev) || out.HasCP != s.HasCP {
			return nil
		}
		if s.HasCP {
			if out.CPToken != s.CPToken || out.CPSize != len(s.CPState) || !within(out.CPUpdated, s.CPLo, s.CPHi) {
				return nil
			}
			s.CPLo, s.CPHi = out.CPUpdated, out.CPUpdated
		}
		if live {
			l := out.Lease
			if l.Owner != s.Last.Owner || l.Token != s.Last.Token || l.TTL != s.Last.TTL ||
				!within(l.Acquired, s.Last.AcqLo, s.Last.AcqHi) || !within(l.Expires, s.Last.ExpLo, s.Last.ExpHi) {
				return nil
			}
			s.Last.AcqLo, s.Last.AcqHi = l.Acquired, l.Acquired
			s.Last.ExpLo, s.Last.ExpHi = l.Expires, l.Expires
		}
		return []State{s}

	case Admit:
		var refusal Refusal
		var mark fencing.Token
		switch {
		case in.Token > s.Issued:
			refusal, mark = TokenNotIssued, s.Issued
		case in.Token < s.HighWater:
			refusal, mark = StaleToken, s.HighWater
		case in.RequireLive && !(live && s.Last.Token == in.Token):
			refusal = LeaseNotHeld
		}
		if refusal != NoRefusal {
			if pending || out.Result != Refused || out.Refusal != refusal || (refusal != LeaseNotHeld && out.Mark != mark) {
				return nil
			}
			return []State{s}
		}
		raised := in.Token > s.HighWater
		s.HighWater = in.Token
		if pending {
			return []State{s}
		}
		if out.Result != OK || out.Issued != s.Issued || out.HighWater != in.Token || out.Raised != raised {
			return nil
		}
		return []State{s}
	}
	panic(fmt.Sprintf("linear: unknown operation kind %d", in.Kind))
}

// answerLease checks a successful answer that extended the live lease (by
// ttl, at an instant within [call, ret]) and pins its times.
func (s State) answerLease(out Output, call, ret, ttl int64) []State {
	l := out.Lease
	if out.Result != OK || l.Owner != s.Last.Owner || l.Token != s.Last.Token || l.TTL != ttl ||
		!within(l.Acquired, s.Last.AcqLo, s.Last.AcqHi) || !within(l.Expires, call+ttl, ret+ttl) {
		return nil
	}
	s.Last.AcqLo, s.Last.AcqHi = l.Acquired, l.Acquired
	s.Last.ExpLo, s.Last.ExpHi = l.Expires, l.Expires
	return []State{s}
}

// newTokens lists the tokens a new lease may get when its answer is lost.
func (s State) newTokens(candidates []fencing.Token) []fencing.Token {
	toks := []fencing.Token{s.Issued + 1}
	if s.skipTokens {
		for _, c := range candidates {
			if c > s.Issued+1 {
				toks = append(toks, c)
			}
		}
	}
	return toks
}
