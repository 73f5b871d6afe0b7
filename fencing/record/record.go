// Package record is the lease state machine for stores that keep a
// resource's whole state in one value and update it under their own lock or
// transaction (the memory and file stores). Each method applies one
// operation of fencing.Store to a Record at a given instant; the caller makes
// the read-modify-write atomic and persists the Record when the method says
// it changed. A method that returns an error leaves the Record exactly as it
// was, so a store may apply it to its stored Record in place. Requests must
// already be validated.
//
// Times are stored as Unix milliseconds: a persisted lease keeps its
// wall-clock expiry across restarts, and millisecond precision is what the
// API shows.
package record

import (
	"math"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// Record is the durable state of one resource.
type Record struct {
	Issued    fencing.Token `json:"issued"`
	HighWater fencing.Token `json:"high_water"`
	// Floor is the store floor this record was last lifted to (see Lift):
	// every token at or below it was issued before a detected loss of the
	// store's data and is never admitted. Zero in a store that never lost
	// its data.
	Floor fencing.Token `json:"floor,omitempty"`
	// Last is the most recent lease: live, expired or released. Nil until
	// the first acquisition.
	Last *Lease `json:"last,omitempty"`
	// Prior is how the lease before Last ended.
	Prior *Previous `json:"prior,omitempty"`
	// Saved describes the stored checkpoint state, if any. The state
	// itself is kept by the store beside the record.
	Saved *Checkpoint `json:"checkpoint,omitempty"`
	// TouchedMs is when an operation last changed the record (acquire,
	// renew, release, checkpoint, an admission): what retention measures
	// idleness from (see Idle). Zero in a record written before it was
	// kept; Idle then falls back on the lease's and checkpoint's times.
	TouchedMs int64 `json:"touched_ms,omitempty"`
}

// Lease is a lease as stored.
type Lease struct {
	Owner      string        `json:"owner"`
	Token      fencing.Token `json:"token"`
	TTLMillis  int64         `json:"ttl_ms"`
	AcquiredMs int64         `json:"acquired_ms"`
	ExpiresMs  int64         `json:"expires_ms"`
	Released   bool          `json:"released,omitempty"`
	Finished   bool          `json:"finished,omitempty"`
}

// Previous is an ended lease as stored.
type Previous struct {
	Owner    string         `json:"owner"`
	Token    fencing.Token  `json:"token"`
	Ended    fencing.Ending `json:"ended"`
	Finished bool           `json:"finished,omitempty"`
}

// Checkpoint is a checkpoint's metadata as stored.
type Checkpoint struct {
	Token     fencing.Token `json:"token"`
	UpdatedMs int64         `json:"updated_ms"`
	SizeBytes int           `json:"size_bytes"`
}

func millis(t time.Time) int64 { return t.UnixMilli() }

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// live reports whether Last is a live lease at now.
func (r *Record) live(now int64) bool {
	return r.Last != nil && !r.Last.Released && now < r.Last.ExpiresMs
}

// Live returns the live lease at now, if any.
func (r *Record) Live(resource string, now time.Time) (fencing.Lease, bool) {
	if !r.live(millis(now)) {
		return fencing.Lease{}, false
	}
	return r.Last.lease(resource), true
}

func (l *Lease) lease(resource string) fencing.Lease {
	return fencing.Lease{
		Resource:   resource,
		Owner:      l.Owner,
		Token:      l.Token,
		TTL:        time.Duration(l.TTLMillis) * time.Millisecond,
		AcquiredAt: fromMillis(l.AcquiredMs),
		ExpiresAt:  fromMillis(l.ExpiresMs),
	}
}

// ended describes Last as an ended lease; only valid when Last is not live.
func (r *Record) ended() *Previous {
	ending := fencing.EndExpired
	if r.Last.Released {
		ending = fencing.EndReleased
	}
	return &Previous{Owner: r.Last.Owner, Token: r.Last.Token, Ended: ending, Finished: r.Last.Finished}
}

// previous is how the most recent ended lease ended, at now.
func (r *Record) previous(now int64) *Previous {
	if r.Last != nil && !r.live(now) {
		return r.ended()
	}
	return r.Prior
}

func (p *Previous) export() *fencing.Previous {
	if p == nil {
		return nil
	}
	return &fencing.Previous{Owner: p.Owner, Token: p.Token, Ended: p.Ended, Finished: p.Finished}
}

// Lift moves the record past a store floor: after a store detects that it
// lost data (its file deleted, replaced or restored from an older copy), it
// picks a floor above every token issued before the loss and lifts each
// record to it when the record is next read. Lifting raises Issued to at
// least floor (so the next token is above every pre-loss token), makes
// Admit refuse every token at or below floor, and ends at now a live lease
// whose token is at or below floor (its holder must acquire again). It
// reports whether the record changed. A floor at or below the record's own
// is a no-op, so lifting is idempotent.
func (r *Record) Lift(floor fencing.Token, now time.Time) bool {
	if floor <= r.Floor {
		return false
	}
	r.Floor = floor
	if r.Issued < floor {
		r.Issued = floor
	}
	if n := millis(now); r.live(n) && r.Last.Token <= floor {
		r.Last.ExpiresMs = n
	}
	return true
}

// Acquire is AcquireAt with no clock: tokens count issued+1 from zero.
func (r *Record) Acquire(req fencing.AcquireRequest, now time.Time) (fencing.Lease, error) {
	return r.AcquireAt(req, now, 0)
}

// AcquireAt applies fencing.Store.Acquire with tokens on the store's
// clock: a new lease gets max(Issued+1, clock), clock being the store's
// clock reading in µs (DESIGN §12). A fresh record (never acquired)
// also starts with its floor at clock-1 (see Lift), so every token issued
// before the record existed (or before it was removed, lost or restored
// from an older copy) is refused as stale, with the mark reported at
// clock, as the Valkey store's records do; the high-water mark itself
// stays zero until the first write, which raises it. A zero clock
// counts from one, for stores and tests that want small tokens. It always
// changes the record when it succeeds (a new lease, or a same-owner
// extension).
func (r *Record) AcquireAt(req fencing.AcquireRequest, now time.Time, clock fencing.Token) (fencing.Lease, error) {
	n := millis(now)
	ttl := req.TTL.Milliseconds()
	if r.live(n) {
		if r.Last.Owner != req.Owner {
			return fencing.Lease{}, &fencing.LeaseHeldError{Resource: req.Resource, Holder: r.Last.Owner, ExpiresAt: fromMillis(r.Last.ExpiresMs), Now: fromMillis(n)}
		}
		r.Last.TTLMillis = ttl
		r.Last.ExpiresMs = n + ttl
		r.TouchedMs = n
		return r.Last.lease(req.Resource), nil
	}
	if r.Last != nil {
		r.Prior = r.ended()
	}
	if r.Last == nil && clock > 0 { // never acquired: a fresh record
		r.Floor = max(r.Floor, clock-1)
	}
	r.Issued = max(r.Issued+1, clock)
	r.TouchedMs = n
	r.Last = &Lease{Owner: req.Owner, Token: r.Issued, TTLMillis: ttl, AcquiredMs: n, ExpiresMs: n + ttl}
	return r.Last.lease(req.Resource), nil
}

// holds reports whether owner and token name the live lease at now.
func (r *Record) holds(owner string, token fencing.Token, now int64) bool {
	return r.live(now) && r.Last.Owner == owner && r.Last.Token == token
}

// Renew applies fencing.Store.Renew.
func (r *Record) Renew(req fencing.RenewRequest, now time.Time) (fencing.Lease, error) {
	n := millis(now)
	if !r.holds(req.Owner, req.Token, n) {
		return fencing.Lease{}, leaseLost(req.Resource)
	}
	if req.TTL != 0 {
		r.Last.TTLMillis = req.TTL.Milliseconds()
	}
	r.Last.ExpiresMs = n + r.Last.TTLMillis
	r.TouchedMs = n
	return r.Last.lease(req.Resource), nil
}

// Release applies fencing.Store.Release. The record changed only when it
// reports released == true.
func (r *Record) Release(req fencing.ReleaseRequest, now time.Time) (released bool, err error) {
	n := millis(now)
	if r.holds(req.Owner, req.Token, n) {
		r.Last.Released = true
		r.Last.Finished = req.Finished
		r.Last.ExpiresMs = n
		r.TouchedMs = n
		return true, nil
	}
	if r.Last != nil && r.Last.Owner == req.Owner && r.Last.Token == req.Token && r.Issued == req.Token {
		return false, nil // already ended, nothing newer issued
	}
	return false, leaseLost(req.Resource)
}

// Checkpoint applies fencing.Store.Checkpoint: the caller stores req.State
// beside the record when it succeeds.
func (r *Record) Checkpoint(req fencing.CheckpointRequest, now time.Time) (fencing.Lease, error) {
	n := millis(now)
	if !r.holds(req.Owner, req.Token, n) {
		return fencing.Lease{}, leaseLost(req.Resource)
	}
	r.Last.ExpiresMs = n + r.Last.TTLMillis
	r.Saved = &Checkpoint{Token: req.Token, UpdatedMs: n, SizeBytes: len(req.State)}
	r.TouchedMs = n
	return r.Last.lease(req.Resource), nil
}

// ReadCheckpoint builds fencing.Store.ReadCheckpoint's answer from the
// record and the stored state.
func (r *Record) ReadCheckpoint(state []byte, now time.Time) (fencing.Checkpoint, error) {
	if r.Saved == nil {
		return fencing.Checkpoint{}, fencing.ErrNoCheckpoint
	}
	return fencing.Checkpoint{
		State:     append([]byte(nil), state...),
		Token:     r.Saved.Token,
		UpdatedAt: fromMillis(r.Saved.UpdatedMs),
		Previous:  r.previous(millis(now)).export(),
	}, nil
}

// Status builds fencing.Store.Status's answer.
func (r *Record) Status(resource string, now time.Time) fencing.Status {
	n := millis(now)
	st := fencing.Status{Resource: resource, Issued: r.Issued, HighWater: r.HighWater, Previous: r.previous(n).export()}
	if r.live(n) {
		l := r.Last.lease(resource)
		st.Lease = &l
	}
	if r.Saved != nil {
		st.Checkpoint = &fencing.CheckpointInfo{Token: r.Saved.Token, UpdatedAt: fromMillis(r.Saved.UpdatedMs), SizeBytes: r.Saved.SizeBytes}
	}
	return st
}

// Admit applies fencing.Store.Admit. It changes the record only when it
// raises the high-water mark (Admission.Raised); an admission at the
// current mark writes nothing, unless the store finds the record's touch
// stale (TouchStale) and Touches it, so that retention keeps a record
// still written to.
func (r *Record) Admit(req fencing.AdmitRequest, now time.Time) (fencing.Admission, error) {
	if req.Token > r.Issued {
		return fencing.Admission{}, &fencing.TokenNotIssuedError{Resource: req.Resource, Token: req.Token, Issued: r.Issued}
	}
	if req.Token < r.HighWater {
		return fencing.Admission{}, &fencing.StaleTokenError{Resource: req.Resource, Token: req.Token, HighWater: r.HighWater}
	}
	if req.Token <= r.Floor {
		return fencing.Admission{}, &fencing.StaleTokenError{Resource: req.Resource, Token: req.Token, HighWater: max(r.HighWater, r.Floor+1), BeforeLoss: true}
	}
	if req.RequireLive && !(r.live(millis(now)) && r.Last.Token == req.Token) {
		return fencing.Admission{}, leaseNotHeld(req.Resource, req.Token)
	}
	raised := req.Token > r.HighWater
	if raised {
		r.HighWater = req.Token
		r.TouchedMs = millis(now)
	}
	return fencing.Admission{Resource: req.Resource, Token: req.Token, HighWater: r.HighWater, Issued: r.Issued, Raised: raised}, nil
}

// Absent answers an admission for a resource the store holds no record of
// (never used, or removed by retention, or lost), at the store's clock
// reading in µs: a token below clock was issued before now, so before the
// record went, and is refused as stale (BeforeLoss, with the mark at
// clock); any other token is not issued. A zero clock (a store counting
// from one) refuses every token as not issued. Nothing is created.
func Absent(req fencing.AdmitRequest, clock fencing.Token) error {
	if req.Token < clock {
		return &fencing.StaleTokenError{Resource: req.Resource, Token: req.Token, HighWater: clock, BeforeLoss: true}
	}
	return &fencing.TokenNotIssuedError{Resource: req.Resource, Token: req.Token, Issued: 0}
}

// Exists reports whether the record holds anything: a record that does
// not reads like a resource never used.
func (r *Record) Exists() bool {
	return r.Issued != 0 || r.HighWater != 0 || r.Last != nil || r.Saved != nil
}

// lastTouched is when the record last changed, as far as it tells.
func (r *Record) lastTouched() int64 {
	t := r.TouchedMs
	if r.Last != nil {
		t = max(t, r.Last.AcquiredMs, r.Last.ExpiresMs)
	}
	if r.Saved != nil {
		t = max(t, r.Saved.UpdatedMs)
	}
	return t
}

// Idle reports whether retention may remove the record at now: no live
// lease, and untouched for at least Kept(retention) as far as the record
// tells. The slack covers the admissions a store
// left unwritten (TouchStale): whatever the store wrote, a record goes
// only once a whole retention has passed since its last operation, and at
// most the slack after that. A zero or negative retention keeps every
// record.
func (r *Record) Idle(now time.Time, retention time.Duration) bool {
	if retention <= 0 {
		return false
	}
	n := millis(now)
	return !r.live(n) && r.lastTouched() <= n-Kept(retention).Milliseconds()
}

// Kept is how long after its last operation an idle record stays at
// least: the retention plus TouchSlack(retention), saturated at the
// longest duration, so that a retention of centuries keeps records for
// centuries instead of wrapping to a negative age that removes them at
// once.
func Kept(retention time.Duration) time.Duration {
	if k := retention + TouchSlack(retention); k >= retention {
		return k
	}
	return math.MaxInt64
}

// TouchSlack is how long after the record's last touch an admission at the
// mark may go unwritten: an eighth of the retention. A store that does not
// write such admissions writes the touch once it is older (TouchStale), so
// a resource written to keeps its record, for one write per resource per
// slack; Idle adds the slack to the retention.
func TouchSlack(retention time.Duration) time.Duration { return max(retention, 0) / 8 }

// TouchStale reports whether the record's last touch is older than
// TouchSlack(retention) at now: a store that skips writing admissions at
// the mark writes one then. A zero retention never goes stale.
func (r *Record) TouchStale(now time.Time, retention time.Duration) bool {
	return retention > 0 && r.lastTouched() < millis(now)-TouchSlack(retention).Milliseconds()
}

// Touch records an operation at now that changed nothing else (an
// admission at the mark), for retention.
func (r *Record) Touch(now time.Time) { r.TouchedMs = max(r.TouchedMs, millis(now)) }

// ClockMicros is t as a token clock reading: Unix µs, never negative.
func ClockMicros(t time.Time) fencing.Token {
	return fencing.Token(max(t.UnixMicro(), 0))
}
