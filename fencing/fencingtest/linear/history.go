package linear

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/fencegate/fencegate/fencing"
)

// History is a recorded concurrent history: every call made, with its
// real-time interval and its answer. Safe for concurrent recording.
type History struct {
	skipTokens bool
	start      time.Time // real-time origin of Call/Return

	mu         sync.Mutex
	ops        []porcupine.Operation
	unexpected []string // answers that match no sentinel of fencing.Store
}

func newHistory(skipTokens bool) *History {
	return &History{skipTokens: skipTokens, start: time.Now()}
}

// Len is the number of operations recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Operations returns the history in Porcupine's form: calls that change
// state and were answered with fencing.ErrAmbiguous return after every
// other event (they may take effect at any time after their call). A read
// (Status, ReadCheckpoint) without an answer keeps the time its caller gave
// up: it changes nothing wherever it ran, so any instant in its interval
// serves, and leaving it open would only slow the search.
func (h *History) Operations() []porcupine.Operation {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	var last int64
	for _, op := range ops {
		last = max(last, op.Call)
		if op.Output.(Output).Result != Ambiguous {
			last = max(last, op.Return)
		}
	}
	for i := range ops {
		if ops[i].Output.(Output).Result == Ambiguous && !readOnly(ops[i].Input.(Input).Kind) {
			ops[i].Return = last + 1
		}
	}
	if h.skipTokens {
		addCandidates(ops)
	}
	return ops
}

// Counts reports how many calls got each kind of answer.
func (h *History) Counts() (ok, refused, ambiguous, unavailable int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, op := range h.ops {
		switch op.Output.(Output).Result {
		case OK:
			ok++
		case Refused:
			refused++
		case Ambiguous:
			ambiguous++
		case Unavailable:
			unavailable++
		}
	}
	return
}

// Unexpected lists answers that matched no sentinel error of
// fencing.Store (recorded as ambiguous).
func (h *History) Unexpected() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.unexpected...)
}

// readOnly reports calls that never change a resource.
func readOnly(k Kind) bool { return k == Status || k == ReadCheckpoint }

// addCandidates gives every pending Acquire of a resource the tokens that
// the history's answers show for the resource and that no answer showed
// before the Acquire was called: with SkipTokens, those are the tokens it
// may have issued, if any answer ever showed its token (see the package
// doc).
func addCandidates(ops []porcupine.Operation) {
	firstSeen := map[string]map[fencing.Token]int64{}
	for _, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		if out.Result != OK && out.Result != Refused {
			continue
		}
		m := firstSeen[in.Resource]
		if m == nil {
			m = map[fencing.Token]int64{}
			firstSeen[in.Resource] = m
		}
		for _, t := range []fencing.Token{out.Lease.Token, out.Mark, out.Issued, out.HighWater, out.Prev.Token, out.CPToken} {
			if at, ok := m[t]; t != 0 && (!ok || op.Return < at) {
				m[t] = op.Return
			}
		}
	}
	for i, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Kind != Acquire || out.Result != Ambiguous {
			continue
		}
		var cands []fencing.Token
		for t, at := range firstSeen[in.Resource] {
			if at >= op.Call {
				cands = append(cands, t)
			}
		}
		sort.Slice(cands, func(a, b int) bool { return cands[a] < cands[b] })
		in.Candidates = cands
		ops[i].Input = in
	}
}

// invoke makes one call on st, records it, and returns its answer. now
// reads the store's clock.
func (h *History) invoke(ctx context.Context, st fencing.Store, client int, now func() time.Time, in Input) Output {
	in.Call = now().UnixMilli()
	call := time.Since(h.start).Nanoseconds()
	out, err := call1(ctx, st, in)
	ret := time.Since(h.start).Nanoseconds()
	classifyErr(&out, err)
	out.Return = now().UnixMilli()
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	if out.Result == Ambiguous && err != nil && !fencing.IsStoreFault(err) {
		h.unexpected = append(h.unexpected, fmt.Sprintf("%s: %v", in.Kind, err))
	}
	h.mu.Unlock()
	return out
}

// call1 performs the call and fills the answer's fields on success.
func call1(ctx context.Context, st fencing.Store, in Input) (Output, error) {
	var out Output
	ttl := time.Duration(in.TTL) * time.Millisecond
	switch in.Kind {
	case Acquire:
		l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: in.Resource, Owner: in.Owner, TTL: ttl})
		out.Lease = leaseView(l)
		return out, err
	case Renew:
		l, err := st.Renew(ctx, fencing.RenewRequest{Resource: in.Resource, Owner: in.Owner, Token: in.Token, TTL: ttl})
		out.Lease = leaseView(l)
		return out, err
	case Release:
		ok, err := st.Release(ctx, fencing.ReleaseRequest{Resource: in.Resource, Owner: in.Owner, Token: in.Token, Finished: in.Finished})
		out.Released = ok
		return out, err
	case Checkpoint:
		l, err := st.Checkpoint(ctx, fencing.CheckpointRequest{Resource: in.Resource, Owner: in.Owner, Token: in.Token, State: json.RawMessage(in.State)})
		out.Lease = leaseView(l)
		return out, err
	case ReadCheckpoint:
		cp, err := st.ReadCheckpoint(ctx, in.Resource)
		if err == nil {
			out.CPState, out.CPToken, out.CPUpdated = string(cp.State), cp.Token, cp.UpdatedAt.UnixMilli()
			out.Prev, out.HasPrev = prevView(cp.Previous)
		}
		return out, err
	case Status:
		s, err := st.Status(ctx, in.Resource)
		if err == nil {
			out.Issued, out.HighWater = s.Issued, s.HighWater
			if s.Lease != nil {
				out.HasLease, out.Lease = true, leaseView(*s.Lease)
			}
			out.Prev, out.HasPrev = prevView(s.Previous)
			if s.Checkpoint != nil {
				out.HasCP, out.CPToken, out.CPUpdated, out.CPSize = true, s.Checkpoint.Token, s.Checkpoint.UpdatedAt.UnixMilli(), s.Checkpoint.SizeBytes
			}
		}
		return out, err
	case Admit:
		a, err := st.Admit(ctx, fencing.AdmitRequest{Resource: in.Resource, Token: in.Token, RequireLive: in.RequireLive})
		out.Issued, out.HighWater, out.Raised = a.Issued, a.HighWater, a.Raised
		return out, err
	}
	panic(fmt.Sprintf("linear: unknown operation kind %d", in.Kind))
}

func leaseView(l fencing.Lease) LeaseView {
	if l.Token == 0 {
		return LeaseView{}
	}
	return LeaseView{Owner: l.Owner, Token: l.Token, TTL: l.TTL.Milliseconds(), Acquired: l.AcquiredAt.UnixMilli(), Expires: l.ExpiresAt.UnixMilli()}
}

func prevView(p *fencing.Previous) (PrevView, bool) {
	if p == nil {
		return PrevView{}, false
	}
	return PrevView{Owner: p.Owner, Token: p.Token, Ended: p.Ended, Finished: p.Finished}, true
}

// classifyErr sets the answer's result from the call's error, using only
// errors.Is and errors.As. A fault that may have been performed, and any
// error that matches no sentinel, is Ambiguous: it is kept in the history
// as possibly performed, never dropped.
func classifyErr(out *Output, err error) {
	var held *fencing.LeaseHeldError
	var stale *fencing.StaleTokenError
	var notIssued *fencing.TokenNotIssuedError
	refuse := func(r Refusal) { out.Result, out.Refusal = Refused, r }
	switch {
	case err == nil:
		out.Result = OK
		return
	case errors.Is(err, fencing.ErrAmbiguous), errors.Is(err, fencing.ErrStoreLost):
		out.Result = Ambiguous
	case errors.Is(err, fencing.ErrUnavailable):
		out.Result = Unavailable
	case errors.As(err, &held):
		refuse(LeaseHeld)
		out.Holder, out.HeldUntil = held.Holder, held.ExpiresAt.UnixMilli()
	case errors.Is(err, fencing.ErrLeaseLost):
		refuse(LeaseLost)
	case errors.As(err, &stale):
		refuse(StaleToken)
		out.Mark = stale.HighWater
	case errors.As(err, &notIssued):
		refuse(TokenNotIssued)
		out.Mark = notIssued.Issued
	case errors.Is(err, fencing.ErrLeaseNotHeld):
		refuse(LeaseNotHeld)
	case errors.Is(err, fencing.ErrNoCheckpoint):
		refuse(NoCheckpoint)
	default:
		out.Result = Ambiguous
	}
	// Only the refusal's own facts are kept: a failed call returns zero
	// values, which are not an answer.
	*out = Output{Result: out.Result, Refusal: out.Refusal, Holder: out.Holder, HeldUntil: out.HeldUntil, Mark: out.Mark}
}

// describe renders a call and its answer for counterexamples and the HTML
// view.
func describe(in Input, out Output) string {
	var b strings.Builder
	switch in.Kind {
	case Acquire:
		fmt.Fprintf(&b, "acquire(%s, ttl %dms)", in.Owner, in.TTL)
	case Renew:
		fmt.Fprintf(&b, "renew(%s, %d, ttl %dms)", in.Owner, in.Token, in.TTL)
	case Release:
		fmt.Fprintf(&b, "release(%s, %d, finished=%v)", in.Owner, in.Token, in.Finished)
	case Checkpoint:
		fmt.Fprintf(&b, "checkpoint(%s, %d, %s)", in.Owner, in.Token, in.State)
	case ReadCheckpoint:
		b.WriteString("read-checkpoint()")
	case Status:
		b.WriteString("status()")
	case Admit:
		fmt.Fprintf(&b, "admit(%d, live=%v)", in.Token, in.RequireLive)
	}
	fmt.Fprintf(&b, " @%d", in.Call)
	b.WriteString(" -> ")
	switch out.Result {
	case Ambiguous:
		b.WriteString("no answer (may run at any time after the call, or never)")
		return b.String()
	case Unavailable:
		b.WriteString("unavailable (not run)")
		return b.String()
	case Refused:
		b.WriteString(out.Refusal.String())
		switch out.Refusal {
		case LeaseHeld:
			fmt.Fprintf(&b, " by %s until %d", out.Holder, out.HeldUntil)
		case StaleToken:
			fmt.Fprintf(&b, " (high water %d)", out.Mark)
		case TokenNotIssued:
			fmt.Fprintf(&b, " (issued %d)", out.Mark)
		}
	default:
		switch in.Kind {
		case Acquire, Renew, Checkpoint:
			fmt.Fprintf(&b, "lease %s", fmtLease(out.Lease))
		case Release:
			fmt.Fprintf(&b, "released=%v", out.Released)
		case ReadCheckpoint:
			fmt.Fprintf(&b, "state %s token %d at %d prev %s", out.CPState, out.CPToken, out.CPUpdated, fmtPrev(out.HasPrev, out.Prev))
		case Status:
			fmt.Fprintf(&b, "issued %d hw %d", out.Issued, out.HighWater)
			if out.HasLease {
				fmt.Fprintf(&b, " lease %s", fmtLease(out.Lease))
			}
			fmt.Fprintf(&b, " prev %s", fmtPrev(out.HasPrev, out.Prev))
			if out.HasCP {
				fmt.Fprintf(&b, " checkpoint token %d at %d (%d bytes)", out.CPToken, out.CPUpdated, out.CPSize)
			}
		case Admit:
			fmt.Fprintf(&b, "admitted (issued %d hw %d raised=%v)", out.Issued, out.HighWater, out.Raised)
		}
	}
	fmt.Fprintf(&b, " @%d", out.Return)
	return b.String()
}

func fmtLease(l LeaseView) string {
	return fmt.Sprintf("{%s token %d ttl %dms %d..%d}", l.Owner, l.Token, l.TTL, l.Acquired, l.Expires)
}

func fmtPrev(has bool, p PrevView) string {
	if !has {
		return "none"
	}
	return fmt.Sprintf("{%s token %d %s finished=%v}", p.Owner, p.Token, p.Ended, p.Finished)
}

func describeState(s State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "issued %d hw %d", s.Issued, s.HighWater)
	if s.HasLast {
		l := s.Last
		fmt.Fprintf(&b, " last {%s token %d ttl %d acq %s exp %s released=%v finished=%v}", l.Owner, l.Token, l.TTL,
			fmtRange(l.AcqLo, l.AcqHi), fmtRange(l.ExpLo, l.ExpHi), l.Released, l.Finished)
	}
	fmt.Fprintf(&b, " prior %s", fmtPrev(s.HasPrior, s.Prior))
	if s.HasCP {
		fmt.Fprintf(&b, " checkpoint {token %d at %s %s}", s.CPToken, fmtRange(s.CPLo, s.CPHi), s.CPState)
	}
	return b.String()
}

func fmtRange(lo, hi int64) string {
	switch {
	case lo == hi:
		return fmt.Sprint(lo)
	case hi >= never:
		return fmt.Sprintf("%d..", lo)
	}
	return fmt.Sprintf("%d..%d", lo, hi)
}
