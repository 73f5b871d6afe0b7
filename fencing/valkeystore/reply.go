package valkeystore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// Script replies, one typed reply and one decode function per script.
//
// Every script but the hot admission ones answers a named reply: its kind
// ("OK", "LOST", "HELD", ...) followed by name/value pairs, in no particular
// order (lib.lua). A decode function reads the pairs it needs by name into
// a typed reply, so a script that gains, reorders or renames a field either
// still decodes or fails loudly as corrupt (fencing.ErrAmbiguous: the script
// ran), never silently into the wrong field. admit.lua and
// admit_register.lua stay positional (fixed short arrays documented in
// their headers) to keep the hot path's reply small, with a typed decoder
// each (admitReply, admitRegisterReply). The table tests in reply_test.go
// run every branch of every script against a real server and check that
// its decoder reads every name the script sends.

// corrupt reports a reply the scripts never produce. The script ran, so the
// outcome is unknown to the caller.
func corrupt(op string, reply []string) error {
	return fmt.Errorf("%w: %s: unexpected script reply %q", fencing.ErrAmbiguous, op, reply)
}

// parseToken reads a decimal token; "" (an absent field) is 0.
func parseToken(s string) (fencing.Token, bool) {
	if s == "" {
		return 0, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return fencing.Token(v), err == nil
}

func parseMillis(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// named decodes a named reply {kind, name1, value1, name2, value2, ...}.
// Its getters record the first problem (a missing name, a value that does
// not parse); err reports it as corrupt, with the whole reply.
type named struct {
	op   string
	raw  []string
	kind string
	bad  string          // the first problem, "" when none
	read map[string]bool // names read, only when tracking (tests)
}

// trackNames, set by the tests only, makes every decoder record the names
// it reads, so that a test can check that a script sends no name its
// decoder ignores (see reply_test.go).
var trackNames = false

// decodeNamed starts decoding r; a reply that is not a kind followed by
// pairs is corrupt (reported by err).
func decodeNamed(op string, r []string) *named {
	n := &named{op: op, raw: r}
	if len(r) == 0 || len(r)%2 != 1 {
		n.bad = "not a kind followed by name/value pairs"
		return n
	}
	n.kind = r[0]
	if trackNames {
		n.read = map[string]bool{}
	}
	return n
}

// str is the value of name; a missing name is a problem.
func (n *named) str(name string) string {
	if n.bad != "" {
		return ""
	}
	for i := 1; i+1 < len(n.raw); i += 2 {
		if n.raw[i] == name {
			if n.read != nil {
				n.read[name] = true
			}
			return n.raw[i+1]
		}
	}
	n.bad = "no " + name
	return ""
}

// token is name's value as a token ("" is 0).
func (n *named) token(name string) fencing.Token {
	v := n.str(name)
	t, ok := parseToken(v)
	if !ok && n.bad == "" {
		n.bad = name + " is not a token"
	}
	return t
}

// millis is name's value as an integer (milliseconds, a count).
func (n *named) millis(name string) int64 {
	v := n.str(name)
	if n.bad != "" {
		return 0
	}
	ms, ok := parseMillis(v)
	if !ok {
		n.bad = name + " is not an integer"
	}
	return ms
}

// optMillis is like millis, but "" is 0.
func (n *named) optMillis(name string) int64 {
	if v := n.str(name); v == "" {
		return 0
	}
	return n.millis(name)
}

// flag is name's value as "1" (true) or "0" or "" (false).
func (n *named) flag(name string) bool {
	switch n.str(name) {
	case "1":
		return true
	case "0", "":
		return false
	}
	if n.bad == "" {
		n.bad = name + " is not a flag"
	}
	return false
}

// err is nil when every read succeeded, else the reply as corrupt.
func (n *named) err() error {
	if n.bad == "" {
		return nil
	}
	return fmt.Errorf("%w (%s)", corrupt(n.op, n.raw), n.bad)
}

// unread lists the names of the reply that no getter read (tracking
// only): a field the script sends and the decoder ignores.
func (n *named) unread() []string {
	var out []string
	for i := 1; i+1 < len(n.raw); i += 2 {
		if !n.read[n.raw[i]] {
			out = append(out, n.raw[i])
		}
	}
	return out
}

// leaseFields is a lease as the scripts name it (lib.lua, fg_lease).
type leaseFields struct {
	token      fencing.Token
	ttlMs      int64
	acquiredMs int64
	expiresMs  int64
}

func (n *named) lease() leaseFields {
	l := leaseFields{token: n.token("token"), ttlMs: n.millis("ttl_ms"), acquiredMs: n.millis("acquired_ms"), expiresMs: n.millis("expires_ms")}
	if n.bad == "" && l.token == 0 {
		n.bad = "token 0"
	}
	return l
}

// of is the lease on res held by owner.
func (l leaseFields) of(res, owner string) fencing.Lease {
	return fencing.Lease{Resource: res, Owner: owner, Token: l.token, TTL: time.Duration(l.ttlMs) * time.Millisecond,
		AcquiredAt: fromMillis(l.acquiredMs), ExpiresAt: fromMillis(l.expiresMs)}
}

// acquireReply is acquire.lua's reply: a lease (OK) or another owner's
// (HELD).
type acquireReply struct {
	held bool
	// OK
	lease leaseFields
	floor fencing.Token
	// HELD
	holder    string
	expiresMs int64
	nowMs     int64
}

func decodeAcquire(r []string) (acquireReply, *named) {
	n := decodeNamed("acquire", r)
	var a acquireReply
	switch n.kind {
	case "OK":
		a.lease, a.floor = n.lease(), n.token("floor")
	case "HELD":
		a.held = true
		a.holder, a.expiresMs, a.nowMs = n.str("holder"), n.millis("expires_ms"), n.millis("now_ms")
	default:
		n.fail()
	}
	return a, n
}

// fail marks an unknown kind.
func (n *named) fail() {
	if n.bad == "" {
		n.bad = "unknown kind " + strconv.Quote(n.kind)
	}
}

// leaseReply is the reply of renew.lua and checkpoint.lua: the renewed
// lease (OK) or LOST.
type leaseReply struct {
	lost  bool
	lease leaseFields
}

func decodeLease(op string, r []string) (leaseReply, *named) {
	n := decodeNamed(op, r)
	var l leaseReply
	switch n.kind {
	case "OK":
		l.lease = n.lease()
	case "LOST":
		l.lost = true
	default:
		n.fail()
	}
	return l, n
}

// releaseReply is release.lua's reply.
type releaseReply struct {
	lost     bool
	released bool // the live lease ended now
}

func decodeRelease(r []string) (releaseReply, *named) {
	n := decodeNamed("release", r)
	var rr releaseReply
	switch n.kind {
	case "OK":
		rr.released = n.flag("released")
	case "LOST":
		rr.lost = true
	default:
		n.fail()
	}
	return rr, n
}

// listReply is list.lua's reply: the live lease, or none.
type listReply struct {
	live  bool
	owner string
	lease leaseFields
}

func decodeList(r []string) (listReply, *named) {
	n := decodeNamed("list", r)
	var l listReply
	switch n.kind {
	case "LIVE":
		l.live, l.owner, l.lease = true, n.str("owner"), n.lease()
	case "NONE":
	default:
		n.fail()
	}
	return l, n
}

// liftReply is lift.lua's reply.
type liftReply struct {
	issued, floor fencing.Token
}

func decodeLift(r []string) (liftReply, *named) {
	n := decodeNamed("lift", r)
	var l liftReply
	if n.kind == "OK" {
		l.issued, l.floor = n.token("issued"), n.token("floor")
	} else {
		n.fail()
	}
	return l, n
}

// barrierReply is barrier_check.lua's reply (and the barrier part of
// admit_register.lua's).
type barrierReply struct {
	lower   int           // unexpired entries with a lower token
	wait    time.Duration // until the earliest of their deadlines
	expired int           // expired lower entries removed
	gone    bool          // barrier_check only: the write's own entry is gone
}

func decodeBarrierCheck(r []string) (barrierReply, *named) {
	n := decodeNamed("barrier check", r)
	var b barrierReply
	switch n.kind {
	case "BARRIER":
		b.lower, b.wait, b.expired = int(n.millis("lower")), time.Duration(n.millis("wait_ms"))*time.Millisecond, int(n.millis("expired"))
	case "GONE":
		b.gone = true
	default:
		n.fail()
	}
	return b, n
}

// record is a resource's record as read by status.lua and
// readcheckpoint.lua, judged at the server's time.
type record struct {
	now       int64
	issued    fencing.Token
	highWater fencing.Token
	live      *fencing.Lease
	previous  *fencing.Previous
	saved     *fencing.CheckpointInfo
	state     []byte // readcheckpoint.lua only
}

// decodeRecord decodes the reply of status.lua (withState false) or
// readcheckpoint.lua (withState true) for resource res.
func decodeRecord(op, res string, r []string, withState bool) (record, *named) {
	n := decodeNamed(op, r)
	var rec record
	if n.kind != "RECORD" {
		n.fail()
		return rec, n
	}
	rec.now = n.millis("now_ms")
	rec.issued, rec.highWater = n.token("issued"), n.token("hw")
	// The lease's times are there when it has an owner, the checkpoint's
	// when it has a token.
	owner, rel, fin := n.str("owner"), n.flag("rel"), n.flag("fin")
	ms := n.optMillis
	if owner != "" {
		ms = n.millis
	}
	tok, ttl, acq, exp := n.token("token"), ms("ttl"), ms("acq"), ms("exp")
	pOwner, pTok, pEnded, pFin := n.str("p_owner"), n.token("p_token"), n.str("p_ended"), n.flag("p_fin")
	cpTok := n.token("cp_token")
	ms = n.optMillis
	if cpTok != 0 {
		ms = n.millis
	}
	cpMs, cpSize := ms("cp_ms"), ms("cp_size")
	if withState {
		rec.state = []byte(n.str("state"))
	}
	if n.bad != "" {
		return rec, n
	}
	if owner != "" {
		if tok == 0 {
			n.bad = "a lease with token 0"
			return rec, n
		}
		l := leaseFields{token: tok, ttlMs: ttl, acquiredMs: acq, expiresMs: exp}.of(res, owner)
		if !rel && rec.now < exp {
			rec.live = &l
		} else {
			ended := fencing.EndExpired
			if rel {
				ended = fencing.EndReleased
			}
			rec.previous = &fencing.Previous{Owner: owner, Token: tok, Ended: ended, Finished: fin}
		}
	}
	if rec.previous == nil && pOwner != "" {
		rec.previous = &fencing.Previous{Owner: pOwner, Token: pTok, Ended: fencing.Ending(pEnded), Finished: pFin}
	}
	if cpTok != 0 {
		rec.saved = &fencing.CheckpointInfo{Token: cpTok, UpdatedAt: fromMillis(cpMs), SizeBytes: int(cpSize)}
	}
	return rec, n
}

// admitKind is the outcome of admit.lua.
type admitKind uint8

const (
	admitOK        admitKind = iota + 1 // admitted
	admitNotIssued                      // token > issued
	admitStale                          // token < high-water mark
	admitFloor                          // token <= floor: predates the record
	admitNotHeld                        // RequireLive and no live lease with the token
	admitWait                           // probe mode: rerun in write mode and WAIT
)

// admitReply is admit.lua's reply, decoded by position (the hot path; the
// order is admit.lua's header):
//
//	{"OK", issued, hw, raised, floor}           modes "0" and "1"
//	{"OK", issued, hw, raised, confirm, floor}  mode "2" (write)
//	{"NOTISSUED", issued, floor}
//	{"STALE", hw}
//	{"FLOOR", floor + 1}
//	{"NOTHELD"}
//	{"WAIT"}                                    mode "1" (probe)
type admitReply struct {
	kind    admitKind
	issued  fencing.Token // OK, NOTISSUED
	hw      fencing.Token // OK, STALE; FLOOR: the lowest token admitted (floor + 1)
	floor   fencing.Token // OK, NOTISSUED
	raised  bool          // OK: hw moved up
	confirm bool          // OK in mode "2": hw was written, WAIT before relying on it
}

// decodeAdmit decodes admit.lua's reply; write reports whether it ran in
// mode "2". ok is false for a reply admit.lua never gives.
func decodeAdmit(r []string, write bool) (a admitReply, ok bool) {
	if len(r) == 0 {
		return a, false
	}
	tok := func(s string) fencing.Token {
		t, good := parseToken(s)
		ok = ok && good
		return t
	}
	flag := func(s string) bool {
		ok = ok && (s == "0" || s == "1")
		return s == "1"
	}
	ok = true
	switch {
	case r[0] == "OK" && len(r) == 5 && !write:
		a = admitReply{kind: admitOK, issued: tok(r[1]), hw: tok(r[2]), raised: flag(r[3]), floor: tok(r[4])}
	case r[0] == "OK" && len(r) == 6 && write:
		a = admitReply{kind: admitOK, issued: tok(r[1]), hw: tok(r[2]), raised: flag(r[3]), confirm: flag(r[4]), floor: tok(r[5])}
	case r[0] == "NOTISSUED" && len(r) == 3:
		a = admitReply{kind: admitNotIssued, issued: tok(r[1]), floor: tok(r[2])}
	case r[0] == "STALE" && len(r) == 2:
		a = admitReply{kind: admitStale, hw: tok(r[1])}
	case r[0] == "FLOOR" && len(r) == 2:
		a = admitReply{kind: admitFloor, hw: tok(r[1])}
	case r[0] == "NOTHELD" && len(r) == 1:
		a = admitReply{kind: admitNotHeld}
	case r[0] == "WAIT" && len(r) == 1 && !write:
		a = admitReply{kind: admitWait}
	default:
		return admitReply{}, false
	}
	return a, ok
}

// admitRegisterReply is admit_register.lua's reply, by position: admit.lua's
// refusals unchanged, or
//
//	{"OK", issued, hw, raised, floor, member, lower, wait_ms, expired}
type admitRegisterReply struct {
	admit   admitReply
	member  string // OK: the registered entry
	barrier barrierReply
}

func decodeAdmitRegister(r []string) (a admitRegisterReply, ok bool) {
	if len(r) == 0 || r[0] != "OK" {
		a.admit, ok = decodeAdmit(r, false)
		return a, ok && a.admit.kind != admitOK && a.admit.kind != admitWait
	}
	if len(r) != 9 {
		return a, false
	}
	if a.admit, ok = decodeAdmit(r[:5], false); !ok {
		return a, false
	}
	lower, err1 := strconv.Atoi(r[6])
	wait, err2 := strconv.ParseInt(r[7], 10, 64)
	expired, err3 := strconv.Atoi(r[8])
	if err1 != nil || err2 != nil || err3 != nil || r[5] == "" {
		return a, false
	}
	a.member = r[5]
	a.barrier = barrierReply{lower: lower, wait: time.Duration(wait) * time.Millisecond, expired: expired}
	return a, true
}
