package valkeystore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"

	"github.com/fencegate/fencegate/fencing"
	"github.com/valkey-io/valkey-go"
)

// Replica confirmation of high-water marks (Options.WaitReplicas > 0).
//
// Valkey replicates asynchronously: a failover to a replica that lagged
// behind can roll a record back, high-water mark included, and a token
// superseded in the lost window could then be admitted again. With
// WaitReplicas = n, Admit does not report success for a token t unless the
// mark hw = t is known to have reached n replicas, so a failover to one of
// them cannot lose the mark a forwarded write relied on.
//
// Which admissions must wait. Not only those that raise hw: when a raise's
// WAIT fails, the write is not forwarded, but hw = t stays on the primary,
// maybe not on any replica. A later admission of the same t finds hw == t
// and raises nothing; forwarding it without a WAIT would rely on exactly
// the unreplicated mark (the same holds while another gate's raise to t is
// still waiting). So every admission relies on a mark that must be
// confirmed. The record keeps the highest confirmed mark in the field hwc,
// written (confirm.lua) only after a WAIT succeeded; it is written after hw
// in the replication stream, so any copy of the record with hwc = t also
// has hw >= t, and a rollback that loses the mark loses its confirmation
// too. An admission of t with t <= hwc (then t == hw) relies on a
// confirmed mark and needs no WAIT: the steady state of a holder writing
// many times with its token costs one script, as without WaitReplicas.
//
// Why a dedicated connection. WAIT numreplicas timeout waits until n
// replicas acknowledged the replication offset of the last write made on
// the connection WAIT is sent on (a connection that wrote nothing waits for
// nothing). The script's write and the WAIT must therefore travel on one
// connection, in that order. valkey-go cannot promise that on its shared
// connections: it spreads auto-pipelined commands over several
// connections, and sends commands it marks as blocking, WAIT among them,
// over a separate pooled connection; a WAIT on the shared client could
// confirm some other connection's offset and report success for a mark no
// replica has. Client.Dedicated borrows one connection for the callback,
// and DoMulti writes the script and the WAIT on it back to back. In a
// cluster the dedicated client binds to the node serving the first
// command's slot (the script's key, hence the resource's primary), and
// WAIT, which has no key, goes to that same connection. A WAIT also blocks
// its connection on the server, which must not stall the shared pipelines.
//
// So the flow of Admit with WaitReplicas > 0 is:
//
//  1. admit.lua in probe mode on the shared, auto-pipelined connections (as
//     fast as without WaitReplicas): refusals, and admissions at a confirmed
//     mark, end here. A token that would raise hw or equals an unconfirmed
//     hw gets {"WAIT"} and nothing is written.
//  2. On a dedicated connection: admit.lua in write mode (it checks again,
//     and writes hw = t even when equal, so that the connection's offset
//     covers the mark), then WAIT n timeout, in one round trip.
//  3. WAIT acknowledged by at least n replicas: confirm.lua sets hwc (its
//     failure is ignored: it costs a later admission another WAIT, nothing
//     else), and Admit succeeds. Fewer replicas, a WAIT error or timeout:
//     Admit fails with fencing.ErrAmbiguous; the mark stays raised on the
//     primary (which is safe, it only refuses older tokens), the gate
//     forwards nothing, and the next admission of t waits again.
//
// Acquire, Renew, Release and Checkpoint do not wait. Token uniqueness does
// not need it: a token is max(issued+1, the server's TIME in microseconds),
// so after a failover that lost an issue, the new primary's clock (in sync,
// see the package doc) issues above the lost token anyway; and the confirmed
// raise of any token covers the acquisition that issued it, which came
// earlier in the same replication stream. A failover may still roll back a
// lease or a checkpoint written in the lost window.
//
// Limits: WAIT confirms that n replicas received the write (in memory), not
// that it is on their disks, and a failover that promotes a replica outside
// those n (when there are more than n replicas) can still lose the mark:
// set WaitReplicas to the number of replicas that may be promoted, or rely
// on the failover choosing the replica with the highest replication offset.

// admitSrc is admit.lua as the store runs it, and admitSrcSHA1 its SHA1,
// for EVALSHA on a dedicated connection (valkey.Lua runs only on a
// valkey.Client) and in the pipelines of AdmitBatch.
var (
	admitSrc     = source("admit")
	admitSrcSHA1 = func() string { h := sha1.Sum([]byte(admitSrc)); return hex.EncodeToString(h[:]) }()
)

// admitWaiting is steps 2 and 3 above: the admit script in write mode and
// WAIT on one dedicated connection, then the confirmation. It returns the
// script's reply (an admission with 5 fields, or a refusal) once the mark
// is confirmed, or a fault.
func (s *Store) admitWaiting(ctx context.Context, req fencing.AdmitRequest, live string) (admitReply, error) {
	if err := s.checkOpen("admit"); err != nil {
		return admitReply{}, err
	}
	if err := s.checkPolicy("admit"); err != nil {
		return admitReply{}, err
	}
	// The script has the command timeout, the WAIT its own on top.
	ctx, cancel := context.WithTimeout(ctx, s.cmdTimeout+s.waitTimeout)
	defer cancel()
	keys := s.admitKeys(req.Resource)
	args := []string{req.Token.String(), live, "2", s.retention}
	var res []valkey.ValkeyResult
	err := s.client.Dedicated(func(c valkey.DedicatedClient) error {
		wait := func() valkey.Completed {
			// Whole ms, at least 1: WAIT's 0 blocks for ever.
			return c.B().Wait().Numreplicas(int64(s.waitReplicas)).Timeout(max(s.waitTimeout.Milliseconds(), 1)).Build()
		}
		res = c.DoMulti(ctx, c.B().Evalsha().Sha1(admitSrcSHA1).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait())
		if verr, ok := valkey.IsValkeyErr(res[0].Error()); ok && verr.IsNoScript() {
			// Not loaded (SCRIPT FLUSH, restart): nothing ran and nothing
			// was written; the WAIT's answer is meaningless. EVAL loads it.
			res = c.DoMulti(ctx, c.B().Eval().Script(admitSrc).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait())
		}
		for _, r := range res {
			if r.NonValkeyError() != nil {
				// Timeout or broken connection: a reply may still be on its
				// way; never hand this connection to another call.
				c.Close()
				break
			}
		}
		return nil
	})
	if err != nil { // Dedicated returns the callback's error only
		return admitReply{}, classify("admit", err)
	}
	s.noteReadOnly(res[0].Error())
	r, err := scriptReply("admit", res[0])
	if err != nil {
		return admitReply{}, err
	}
	a, ok := decodeAdmit(r, true)
	if !ok {
		return admitReply{}, corrupt("admit", r)
	}
	if a.kind != admitOK || !a.confirm {
		return a, nil // a refusal, or a mark confirmed meanwhile: no WAIT needed
	}
	acked, err := res[1].AsInt64()
	if err != nil {
		return admitReply{}, fmt.Errorf("%w: admit: the high-water mark of %q was written on the primary; WAIT for %d replicas failed: %w",
			fencing.ErrAmbiguous, req.Resource, s.waitReplicas, err)
	}
	if acked < int64(s.waitReplicas) {
		return admitReply{}, fmt.Errorf("%w: admit: the high-water mark of %q was written on the primary but reached %d of %d replicas within %v",
			fencing.ErrAmbiguous, req.Resource, acked, s.waitReplicas, s.waitTimeout)
	}
	// Confirmed. Recording it spares later admissions of this token a WAIT;
	// if it fails, they wait again, which is safe.
	if err := confirmScript.Exec(ctx, s.client, []string{s.recKey(req.Resource)}, []string{req.Token.String()}).Error(); err != nil {
		s.log.Debug("valkeystore: could not record a confirmed high-water mark; the next admission waits again",
			"resource", req.Resource, "error", err)
	}
	return a, nil
}
