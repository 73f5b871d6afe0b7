package valkeystore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// leaseLost is the error of a renew, release or checkpoint by a caller that
// does not hold the live lease.
func leaseLost(res string) error {
	return fmt.Errorf("%w: the caller does not hold the live lease on %q", fencing.ErrLeaseLost, res)
}

// Acquire implements fencing.Store. It is never retried: a fault after
// sending matches fencing.ErrAmbiguous, and the caller may acquire again as
// the same owner (which extends the lease it may have got).
func (s *Store) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	seen, known := s.seen.resource(req.Resource)
	hint := max(s.seen.floor(), seen.issued)
	seenFloor := ""
	if known {
		seenFloor = seen.floor.String()
	}
	r, err := s.run(ctx, "acquire", acquireScript, s.leaseKeys(req.Resource),
		[]string{req.Owner, strconv.FormatInt(req.TTL.Milliseconds(), 10), hint.String(), seen.issued.String(), seenFloor, s.retention})
	if err != nil {
		return fencing.Lease{}, err
	}
	a, n := decodeAcquire(r)
	if err := n.err(); err != nil {
		return fencing.Lease{}, err
	}
	if a.held {
		return fencing.Lease{}, &fencing.LeaseHeldError{Resource: req.Resource, Holder: a.holder, ExpiresAt: fromMillis(a.expiresMs), Now: fromMillis(a.nowMs)}
	}
	s.seen.observe(req.Resource, a.lease.token, 0, a.floor)
	return a.lease.of(req.Resource, req.Owner), nil
}

// Renew implements fencing.Store.
func (s *Store) Renew(ctx context.Context, req fencing.RenewRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	ttl := ""
	if req.TTL != 0 {
		ttl = strconv.FormatInt(req.TTL.Milliseconds(), 10)
	}
	r, err := s.run(ctx, "renew", renewScript, s.leaseKeys(req.Resource),
		[]string{req.Owner, req.Token.String(), ttl, s.retention})
	if err != nil {
		return fencing.Lease{}, err
	}
	return renewed("renew", req.Resource, req.Owner, r)
}

// renewed is the answer of Renew and Checkpoint from the script's reply.
func renewed(op, res, owner string, r []string) (fencing.Lease, error) {
	l, n := decodeLease(op, r)
	if err := n.err(); err != nil {
		return fencing.Lease{}, err
	}
	if l.lost {
		return fencing.Lease{}, leaseLost(res)
	}
	return l.lease.of(res, owner), nil
}

// Release implements fencing.Store. It is never retried (a retry after a
// lost reply would answer false).
func (s *Store) Release(ctx context.Context, req fencing.ReleaseRequest) (bool, error) {
	if err := req.Validate(); err != nil {
		return false, err
	}
	fin := "0"
	if req.Finished {
		fin = "1"
	}
	r, err := s.run(ctx, "release", releaseScript, s.leaseKeys(req.Resource),
		[]string{req.Owner, req.Token.String(), fin, s.retention})
	if err != nil {
		return false, err
	}
	rr, n := decodeRelease(r)
	if err := n.err(); err != nil {
		return false, err
	}
	if rr.lost {
		return false, leaseLost(req.Resource)
	}
	return rr.released, nil
}

// Checkpoint implements fencing.Store.
func (s *Store) Checkpoint(ctx context.Context, req fencing.CheckpointRequest) (fencing.Lease, error) {
	if err := req.Validate(s.maxState); err != nil {
		return fencing.Lease{}, err
	}
	r, err := s.run(ctx, "checkpoint", checkpointScript,
		s.leaseKeys(req.Resource),
		[]string{req.Owner, req.Token.String(), string(req.State), s.retention})
	if err != nil {
		return fencing.Lease{}, err
	}
	return renewed("checkpoint", req.Resource, req.Owner, r)
}

// ReadCheckpoint implements fencing.Store. A checkpoint exists when the
// record has checkpoint metadata and the state key P:{R}:state holds a
// non-empty string; metadata whose state is gone (the key was deleted
// outside fencegate) reads as no checkpoint, here and in Status, so a
// caller never receives an empty state. A state that is not valid JSON
// (only possible when the key was overwritten outside fencegate) is an
// error that matches no fencing sentinel: an internal error, not a
// checkpoint.
func (s *Store) ReadCheckpoint(ctx context.Context, resource string) (fencing.Checkpoint, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Checkpoint{}, err
	}
	f, err := s.run(ctx, "read checkpoint", readCheckpointScript, []string{s.recKey(resource), s.stateKey(resource)}, nil)
	if err != nil {
		return fencing.Checkpoint{}, err
	}
	r, n := decodeRecord("read checkpoint", resource, f, true)
	if err := n.err(); err != nil {
		return fencing.Checkpoint{}, err
	}
	if r.saved == nil {
		return fencing.Checkpoint{}, fmt.Errorf("%w for %q", fencing.ErrNoCheckpoint, resource)
	}
	state := r.state
	if !json.Valid(state) {
		return fencing.Checkpoint{}, fmt.Errorf("valkeystore: the checkpoint state of %q is not valid JSON (its key was changed outside fencegate)", resource)
	}
	return fencing.Checkpoint{State: state, Token: r.saved.Token, UpdatedAt: r.saved.UpdatedAt, Previous: r.previous}, nil
}

// Status implements fencing.Store.
func (s *Store) Status(ctx context.Context, resource string) (fencing.Status, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Status{}, err
	}
	f, err := s.run(ctx, "status", statusScript, []string{s.recKey(resource), s.stateKey(resource)}, nil)
	if err != nil {
		return fencing.Status{}, err
	}
	r, n := decodeRecord("status", resource, f, false)
	if err := n.err(); err != nil {
		return fencing.Status{}, err
	}
	return fencing.Status{Resource: resource, Issued: r.issued, HighWater: r.highWater, Lease: r.live, Previous: r.previous, Checkpoint: r.saved}, nil
}

// Admit implements fencing.Store. The check and the raise of the high-water
// mark are one script. It is idempotent, so a caller may retry it after
// fencing.ErrAmbiguous with the same token.
//
// With Options.WaitReplicas > 0, an admission succeeds only once the mark
// it relies on is confirmed on that many replicas (see wait.go): an
// admission at an already confirmed mark costs one script, as without it;
// one that raises the mark (or relies on an unconfirmed one) also waits
// for the replicas, up to Options.WaitTimeout, and fails with
// fencing.ErrAmbiguous when they do not confirm.
func (s *Store) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	if err := req.Validate(); err != nil {
		return fencing.Admission{}, err
	}
	live := "0"
	if req.RequireLive {
		live = "1"
	}
	mode := "0"
	if s.waitReplicas > 0 {
		mode = "1" // probe: see wait.go
	}
	args := []string{req.Token.String(), live, mode, s.retention}
	before, known := s.seen.resource(req.Resource)
	top := s.seen.floor()
	sent := s.now()
	r, err := s.run(ctx, "admit", admitScript, s.admitKeys(req.Resource), args)
	if err != nil {
		return fencing.Admission{}, err
	}
	a, ok := decodeAdmit(r, false)
	if !ok || a.kind == admitWait && s.waitReplicas == 0 {
		return fencing.Admission{}, corrupt("admit", r)
	}
	if a.kind == admitWait {
		if a, err = s.admitWaiting(ctx, req, live); err != nil {
			return fencing.Admission{}, err
		}
	}
	return s.admitted(ctx, req, a, top, before, known, sent)
}

// admitted is the answer to an admission from admit.lua's reply (also
// admit_register.lua's), checked against what this Store had seen before
// sending the call (top, before, known: see checkNotLost). sent is the
// Store.now at which a script was sent that applied the retention (see
// keptRecently): the script ran after it; 0 for an answer read from the
// record's marks.
func (s *Store) admitted(ctx context.Context, req fencing.AdmitRequest, a admitReply, top fencing.Token, before seenRecord, known bool, sent time.Duration) (fencing.Admission, error) {
	switch a.kind {
	case admitOK:
		if err := s.checkNotLost(ctx, req.Resource, top, before, known, a.issued, a.hw, a.floor); err != nil {
			return fencing.Admission{}, err
		}
		if sent > 0 {
			s.seen.kept(req.Resource, sent)
		}
		return fencing.Admission{Resource: req.Resource, Token: req.Token, HighWater: a.hw, Issued: a.issued, Raised: a.raised}, nil
	case admitNotIssued:
		if a.issued == 0 && known && req.Token <= before.issued {
			// The record is gone, and admit.lua found the token at or
			// above the server's clock (below it, it answers FLOOR): a
			// token this Store saw issued on the resource is ahead of the
			// clock, which therefore cannot refuse the tokens issued
			// before the record went. Not a removal the clock covers: a
			// loss, lifted past them.
			return fencing.Admission{}, s.storeLost(ctx, req.Resource, top, before, 0, 0, 0)
		}
		if err := s.checkNotLost(ctx, req.Resource, top, before, known, a.issued, 0, a.floor); err != nil {
			return fencing.Admission{}, err
		}
		return fencing.Admission{}, &fencing.TokenNotIssuedError{Resource: req.Resource, Token: req.Token, Issued: a.issued}
	case admitStale:
		return fencing.Admission{}, &fencing.StaleTokenError{Resource: req.Resource, Token: req.Token, HighWater: a.hw}
	case admitFloor:
		return fencing.Admission{}, &fencing.StaleTokenError{Resource: req.Resource, Token: req.Token, HighWater: a.hw, BeforeLoss: true}
	case admitNotHeld:
		return fencing.Admission{}, fmt.Errorf("%w: no live lease on %q holds token %d", fencing.ErrLeaseNotHeld, req.Resource, req.Token)
	}
	return fencing.Admission{}, fmt.Errorf("%w: admit: unexpected outcome %d", fencing.ErrAmbiguous, a.kind)
}

// checkNotLost compares a resource's issued counter, high-water mark (0
// when the answer does not carry it) and floor as the server answered them
// with what this Store had seen before sending the call
// (seen, known; top, the highest token seen on any resource; see seen.go).
// An issued counter or a mark below the one seen, or another floor, means the record
// lost writes or was created afresh: it is lifted past every token this
// Store had seen (not past tokens issued since the call was sent, which
// are post-loss) and the call fails with fencing.ErrStoreLost. Otherwise
// the answer is remembered.
func (s *Store) checkNotLost(ctx context.Context, res string, top fencing.Token, seen seenRecord, known bool, issued, hw, floor fencing.Token) error {
	if !seen.lost(known, issued, hw, floor) {
		s.seen.observe(res, issued, hw, floor)
		return nil
	}
	return s.storeLost(ctx, res, top, seen, issued, hw, floor)
}

// storeLost lifts res's record past every token this Store had seen (top,
// seen.issued) after an answer (issued, floor) showed that it lost data,
// and returns the fencing.ErrStoreLost the call fails with (hw 0: the
// answer did not carry the mark).
func (s *Store) storeLost(ctx context.Context, res string, top fencing.Token, seen seenRecord, issued, hw, floor fencing.Token) error {
	to := max(top, seen.issued)
	s.log.Error("valkeystore: the store lost data: a resource's record is older than one this gate saw; moving it past every token this gate has seen",
		"resource", res, "issued", issued, "hw", hw, "floor", floor, "seen_issued", seen.issued, "seen_hw", seen.hw, "seen_floor", seen.floor, "lift_to", to)
	lost := fmt.Errorf("%w: %q: the record (issued %d, high-water mark %d, floor %d) is not the one seen before (issued %d, high-water mark %d, floor %d)",
		fencing.ErrStoreLost, res, issued, hw, floor, seen.issued, seen.hw, seen.floor)
	r, err := s.run(ctx, "lift", liftScript, s.leaseKeys(res), []string{to.String(), s.retention})
	if err != nil {
		return fmt.Errorf("%w; lifting it failed: %w", lost, err)
	}
	l, n := decodeLift(r)
	if err := n.err(); err != nil {
		return fmt.Errorf("%w; lift: %w", lost, err)
	}
	s.seen.observe(res, l.issued, 0, l.floor)
	return fmt.Errorf("%w; it now refuses every token up to %d", lost, l.floor)
}
