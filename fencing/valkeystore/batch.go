package valkeystore

import (
	"context"
	"sync"

	"github.com/valkey-io/valkey-go"

	"github.com/fencegate/fencegate/fencing"
)

// AdmitBatch implements fencing.BatchAdmitter: the admissions go to the
// server as pipelines (one write, one read for the lot; on a cluster one
// per node), each answered exactly as Admit answers it.
//
// A request that does not require a live lease is first answered from a
// read of its record's marks (HMGET issued hw floor, one command, so one
// atomic snapshot): a token equal to the high-water mark, issued and above
// the floor is admitted at the mark, which is what admit.lua would answer
// at that instant, without writing anything. Every other request (a raise,
// a refusal, a required lease) runs admit.lua, in a second pipeline for
// those the read did not settle; a request whose marks the caller has just
// read (MarkRead: a mark reader did not settle it) runs it without the
// read. A call the server answers NOSCRIPT (after
// SCRIPT FLUSH or a restart) is run again alone through Admit's path,
// which loads the script. With WaitReplicas each admission runs Admit's
// own path, concurrently.
func (s *Store) AdmitBatch(ctx context.Context, reqs []fencing.AdmitRequest, out []fencing.Admission, errs []error) {
	if s.waitReplicas > 0 {
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() { out[i], errs[i] = s.Admit(ctx, reqs[i]) })
		}
		wg.Wait()
		return
	}
	fail := s.checkOpen("admit")
	if fail == nil {
		fail = s.checkPolicy("admit")
	}
	b := batch{s: s, ctx: ctx, reqs: reqs, out: out, errs: errs, top: s.seen.floor()}
	var reads, scripts []batchCall
	for i, req := range reqs {
		out[i], errs[i] = fencing.Admission{}, fail
		if fail != nil {
			continue
		}
		if errs[i] = req.Validate(); errs[i] != nil {
			continue
		}
		c := batchCall{i: i}
		c.before, c.known = s.seen.resource(req.Resource)
		if req.RequireLive || req.MarkRead {
			scripts = append(scripts, c)
		} else {
			reads = append(reads, c)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, s.cmdTimeout)
	defer cancel()
	scripts = append(scripts, b.readMarks(cctx, reads)...)
	b.runScripts(cctx, scripts)
}

// batch is one AdmitBatch call.
type batch struct {
	s    *Store
	ctx  context.Context
	reqs []fencing.AdmitRequest
	out  []fencing.Admission
	errs []error
	top  fencing.Token // the highest token seen before sending (see checkNotLost)
}

// batchCall is a request of a batch, with what the Store had seen of its
// resource before sending it.
type batchCall struct {
	i      int
	before seenRecord
	known  bool
}

// readMarks reads the marks of calls' records and admits those at the
// mark; it returns the calls left to admit.lua.
func (b *batch) readMarks(ctx context.Context, calls []batchCall) []batchCall {
	if len(calls) == 0 {
		return nil
	}
	s := b.s
	cmds := make(valkey.Commands, len(calls))
	for k, c := range calls {
		cmds[k] = s.client.B().Hmget().Key(s.recKey(b.reqs[c.i].Resource)).Field("issued", "hw", "floor").Build()
	}
	var rest []batchCall
	for k, res := range s.client.DoMulti(ctx, cmds...) {
		c := calls[k]
		req := b.reqs[c.i]
		f, err := res.ToArray()
		if err != nil {
			s.noteReadOnly(err)
			b.errs[c.i] = classify("admit", err)
			continue
		}
		var v [3]string
		for j := range min(len(f), 3) {
			v[j], _ = f[j].ToString() // a missing field reads as ""
		}
		issued, ok1 := parseToken(v[0])
		hw, ok2 := parseToken(v[1])
		floor, ok3 := parseToken(v[2])
		if len(f) != 3 || !ok1 || !ok2 || !ok3 || !atMark(req.Token, issued, hw, floor) || !s.keptRecently(c.before, c.known) {
			rest = append(rest, c) // not at the mark, or not plainly, or the retention is due: the script judges
			continue
		}
		b.out[c.i], b.errs[c.i] = s.admitted(b.ctx, req, admitReply{kind: admitOK, issued: issued, hw: hw, floor: floor}, b.top, c.before, c.known, 0)
	}
	return rest
}

// runScripts runs admit.lua for calls, in one pipeline.
func (b *batch) runScripts(ctx context.Context, calls []batchCall) {
	if len(calls) == 0 {
		return
	}
	s := b.s
	cmds := make(valkey.Commands, len(calls))
	for k, c := range calls {
		req := b.reqs[c.i]
		live := "0"
		if req.RequireLive {
			live = "1"
		}
		keys := s.admitKeys(req.Resource)
		cmds[k] = s.client.B().Evalsha().Sha1(admitSrcSHA1).Numkeys(int64(len(keys))).Key(keys...).Arg(req.Token.String(), live, "0", s.retention).Build()
	}
	sent := s.now()
	for k, res := range s.client.DoMulti(ctx, cmds...) {
		c := calls[k]
		req := b.reqs[c.i]
		if e, ok := valkey.IsValkeyErr(res.Error()); ok && e.IsNoScript() {
			b.out[c.i], b.errs[c.i] = s.Admit(b.ctx, req)
			continue
		}
		s.noteReadOnly(res.Error())
		r, err := scriptReply("admit", res)
		if err != nil {
			b.errs[c.i] = err
			continue
		}
		a, ok := decodeAdmit(r, false)
		if !ok || a.kind == admitWait {
			b.errs[c.i] = corrupt("admit", r)
			continue
		}
		b.out[c.i], b.errs[c.i] = s.admitted(b.ctx, req, a, b.top, c.before, c.known, sent)
	}
}
