package valkeystore

import (
	"context"
	"sync"

	"github.com/valkey-io/valkey-go"

	"github.com/fencegate/fencegate/fencing"
)

// AdmitBatch implements fencing.BatchAdmitter: the admissions go to the
// server as one pipeline of admit.lua calls (one write, one read for the
// lot, on a cluster one per node), each answered exactly as Admit answers
// it. A call the server answers NOSCRIPT (after SCRIPT FLUSH or a restart)
// is run again alone through Admit's path, which loads the script. With
// WaitReplicas each admission runs Admit's own path, concurrently. It
// always reports true.
func (s *Store) AdmitBatch(ctx context.Context, reqs []fencing.AdmitRequest, out []fencing.Admission, errs []error) bool {
	if s.waitReplicas > 0 {
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Go(func() { out[i], errs[i] = s.Admit(ctx, reqs[i]) })
		}
		wg.Wait()
		return true
	}
	fail := s.checkOpen("admit")
	if fail == nil {
		fail = s.checkPolicy("admit")
	}
	type sent struct {
		i      int
		before seenRecord
		known  bool
	}
	var (
		cmds  = make(valkey.Commands, 0, len(reqs))
		calls = make([]sent, 0, len(reqs))
		top   = s.seen.floor()
	)
	for i, req := range reqs {
		out[i], errs[i] = fencing.Admission{}, fail
		if fail != nil {
			continue
		}
		if errs[i] = req.Validate(); errs[i] != nil {
			continue
		}
		live := "0"
		if req.RequireLive {
			live = "1"
		}
		before, known := s.seen.resource(req.Resource)
		calls = append(calls, sent{i: i, before: before, known: known})
		cmds = append(cmds, s.client.B().Evalsha().Sha1(admitSrcSHA1).Numkeys(1).
			Key(s.recKey(req.Resource)).Arg(req.Token.String(), live).Build())
	}
	if len(cmds) == 0 {
		return true
	}
	cctx, cancel := context.WithTimeout(ctx, s.cmdTimeout)
	defer cancel()
	for k, res := range s.client.DoMulti(cctx, cmds...) {
		c := calls[k]
		req := reqs[c.i]
		if e, ok := valkey.IsValkeyErr(res.Error()); ok && e.IsNoScript() {
			out[c.i], errs[c.i] = s.Admit(ctx, req)
			continue
		}
		r, err := scriptReply("admit", res)
		if err != nil {
			errs[c.i] = err
			continue
		}
		out[c.i], errs[c.i] = s.admitReply(ctx, req, r, top, c.before, c.known)
	}
	return true
}
