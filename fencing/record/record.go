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

// Acquire applies fencing.Store.Acquire. It always changes the record when
// it succeeds (a new lease, or a same-owner extension).
func (r *Record) Acquire(req fencing.AcquireRequest, now time.Time) (fencing.Lease, error) {
	n := millis(now)
	ttl := req.TTL.Milliseconds()
	if r.live(n) {
		if r.Last.Owner != req.Owner {
			return fencing.Lease{}, &fencing.LeaseHeldError{Resource: req.Resource, Holder: r.Last.Owner, ExpiresAt: fromMillis(r.Last.ExpiresMs), Now: fromMillis(n)}
		}
		r.Last.TTLMillis = ttl
		r.Last.ExpiresMs = n + ttl
		return r.Last.lease(req.Resource), nil
	}
	if r.Last != nil {
		r.Prior = r.ended()
	}
	r.Issued++
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
// raises the high-water mark (Admission.Raised); an admission at the current
// mark writes nothing.
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
	r.HighWater = req.Token
	return fencing.Admission{Resource: req.Resource, Token: req.Token, HighWater: r.HighWater, Issued: r.Issued, Raised: raised}, nil
}
