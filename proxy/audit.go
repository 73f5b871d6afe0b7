package proxy

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/internal/loglimit"
)

// AuditMessage is the message of the gate's audit log lines: one per
// unsafe request (write), logged at info when its outcome is final (the
// moment it is counted in MetricWrites), with these attributes:
//
//   - request_id, client, method, path: the request as received (client
//     is the peer's address; path truncated to 256 bytes);
//   - code: the outcome code of MetricWrites (admitted, stale-token,
//     barrier-timeout, ...);
//   - resource, token: once the gate has worked them out; for a refused
//     write on two resources (COPY, MOVE), the resource that refused it
//     and the token checked there, as the problem answer says;
//   - high_water, issued: the resource's high-water mark and newest
//     issued token, where the store reported them (on admission, or with
//     stale-token / token-not-issued);
//   - upstream_status: the upstream's answer, for forwarded writes that
//     got one;
//   - duration_ms: from the gate receiving the request to the outcome.
const AuditMessage = "gate write"

// CutOffMessage is the message of the warning LogCutOff writes for each
// write still in flight when the shutdown grace ends. That line is the
// write's only one: its audit line is not written when it ends later.
const CutOffMessage = "write cut off at shutdown"

// AccessMessage is the message of the access log's lines for reads (safe
// methods) through the gate, with Audit.Access: request_id, client, method,
// path, status and duration_ms. Writes have their audit line instead.
const AccessMessage = "gate read"

// RefusalsPerSecond bounds the refusal lines logged with Audit.Off, so a
// flood of refused writes cannot flood the log; the next line logged after
// some were dropped says how many in its "suppressed" attribute.
const RefusalsPerSecond = 20

// Audit configures the audit log. The zero value logs every write.
type Audit struct {
	// Off turns the lines of successful writes off. Refused and failed
	// writes are still logged, at most RefusalsPerSecond a second: a
	// refusal is what an operator looks for. LogCutOff still lists
	// cut-off writes.
	Off bool
	// Sample, when in (0, 1), is the fraction of successful writes
	// (admitted, unfenced) that are logged, chosen at random, for a busy
	// gate; 0 or 1 logs them all. Refused and failed writes are always
	// logged.
	Sample float64
	// Access also logs one line (AccessMessage) per read through the gate.
	Access bool

	// limit is the refusal lines' rate limit under Off, set up by NewGate
	// (a Limiter can be copied until it is used, so an Audit can be
	// copied into Options).
	limit loglimit.Limiter
}

// auditRecord is what the audit line of one write says. Its fields are
// written by the request's handler only; LogCutOff reads them from another
// goroutine, hence the lock. A nil *auditRecord (a read) records nothing.
type auditRecord struct {
	mu                      sync.Mutex
	start                   time.Time
	client                  net.Addr // rendered only when a line is written
	id, method, path        string
	resource                string
	token, highWater, issue fencing.Token
	status                  int
	cutOff                  bool // LogCutOff wrote its line: no audit line

	// The record's place in the gate's set of writes in flight, written
	// under the shard's lock.
	shard      *auditShard
	prev, next *auditRecord
}

// openAudit gives a write an audit record and registers it as in flight
// until closeAudit.
func (g *Gate) openAudit(x *exchange) {
	p := x.path
	if len(p) > 256 {
		p = p[:256]
	}
	x.auditRec = auditRecord{start: x.start, client: x.remoteAddr(), id: x.id, method: x.method, path: p}
	x.audit = &x.auditRec
	g.inFlight.add(x.audit)
}

// closeAudit ends a write's registration as in flight.
func (g *Gate) closeAudit(x *exchange) {
	if x.audit != nil {
		g.inFlight.remove(x.audit)
	}
}

// checked records the resource and token a write was checked for.
func (rec *auditRecord) checked(resource string, token fencing.Token) {
	if rec != nil {
		rec.mu.Lock()
		rec.resource, rec.token = resource, token
		rec.mu.Unlock()
	}
}

// admitted records the marks the store reported on admission.
func (rec *auditRecord) admitted(a fencing.Admission) {
	if rec != nil {
		rec.mu.Lock()
		rec.highWater, rec.issue = a.HighWater, a.Issued
		rec.mu.Unlock()
	}
}

// problem records the resource, token and marks a refusal reports (the
// resource and token checked, which for a write on two resources is the
// one that refused; stale-token carries the high-water mark,
// token-not-issued the newest issued token).
func (rec *auditRecord) problem(p *problem.Error) {
	if rec == nil {
		return
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if r, ok := p.Extra["resource"].(string); ok && r != "" {
		rec.resource = r
		if t, ok := p.Extra["token"].(fencing.Token); ok {
			rec.token = t
		}
	}
	if t, ok := p.Extra["high_water_token"].(fencing.Token); ok {
		rec.highWater = t
	}
	if t, ok := p.Extra["issued_token"].(fencing.Token); ok {
		rec.issue = t
	}
}

// answered records the upstream's status for a forwarded write.
func (rec *auditRecord) answered(status int) {
	if rec != nil {
		rec.mu.Lock()
		rec.status = status
		rec.mu.Unlock()
	}
}

// auditEnd logs a write's audit line with its final outcome code. It is
// called from count, once per write.
func (g *Gate) auditEnd(x *exchange, code string) {
	if x.audit == nil {
		return
	}
	success := code == CodeAdmitted || code == CodeUnfenced
	if g.audit.Off && success {
		return
	}
	if s := g.audit.Sample; s > 0 && s < 1 && success && rand.Float64() >= s {
		return
	}
	if !g.log.Enabled(x.ctx, slog.LevelInfo) {
		return
	}
	var suppressed int64
	if g.audit.Off {
		ok, n := g.audit.limit.Allow(time.Now())
		if !ok {
			return
		}
		suppressed = n
	}
	attrs, ok := x.audit.endAttrs(code)
	if !ok {
		return // its cut-off line was its line
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("suppressed", suppressed))
	}
	g.log.LogAttrs(x.ctx, slog.LevelInfo, AuditMessage, attrs...)
}

// endAttrs is attrs for the write's final line, unless LogCutOff already
// wrote its line (ok false).
func (rec *auditRecord) endAttrs(code string) (a []slog.Attr, ok bool) {
	rec.mu.Lock()
	cut := rec.cutOff
	rec.mu.Unlock()
	if cut {
		return nil, false
	}
	return rec.attrs(code), true
}

// accessEnd logs a read's access line (Audit.Access).
func (g *Gate) accessEnd(x *exchange, status int) {
	if !g.audit.Access || !g.log.Enabled(x.ctx, slog.LevelInfo) {
		return
	}
	p := x.path
	if len(p) > 256 {
		p = p[:256]
	}
	ms := float64(time.Since(x.start).Microseconds()) / 1000
	g.log.LogAttrs(x.ctx, slog.LevelInfo, AccessMessage, slog.String("request_id", x.id),
		slog.String("client", addrString(x.remoteAddr())), slog.String("method", x.method),
		slog.String("path", p), slog.Int("status", status), slog.Float64("duration_ms", ms))
}

// addrString renders a peer address ("" when unknown).
func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// attrs are the audit line's attributes.
func (rec *auditRecord) attrs(code string) []slog.Attr {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	a := make([]slog.Attr, 0, 13)
	a = append(a, slog.String("request_id", rec.id), slog.String("client", addrString(rec.client)),
		slog.String("method", rec.method), slog.String("path", rec.path), slog.String("code", code))
	if rec.resource != "" {
		a = append(a, slog.String("resource", rec.resource), slog.Uint64("token", uint64(rec.token)))
	}
	if rec.highWater != 0 {
		a = append(a, slog.Uint64("high_water", uint64(rec.highWater)))
	}
	if rec.issue != 0 {
		a = append(a, slog.Uint64("issued", uint64(rec.issue)))
	}
	if rec.status != 0 {
		a = append(a, slog.Int("upstream_status", rec.status))
	}
	ms := float64(time.Since(rec.start).Microseconds()) / 1000
	return append(a, slog.Float64("duration_ms", ms))
}

// LogCutOff logs a warning (CutOffMessage, code "cut-off", with the audit
// line's attributes) for every write still in the gate: waiting for the
// store or the barrier, or forwarded and not yet answered. The server's
// shutdown calls it when its grace ends and connections are about to be
// closed: writes among these that were forwarded may still be applied by
// the upstream. It returns how many it logged, and logs regardless of
// Audit.Off. Each such write gets this line only: its audit line is not
// written when it ends afterwards.
func (g *Gate) LogCutOff() int {
	recs := g.inFlight.list()
	for _, rec := range recs {
		attrs := rec.attrs("cut-off")
		rec.mu.Lock()
		rec.cutOff = true
		rec.mu.Unlock()
		g.log.LogAttrs(context.Background(), slog.LevelWarn, CutOffMessage, attrs...)
	}
	return len(recs)
}

// InFlight is the number of writes in the gate: received, and their
// outcome not final yet (waiting for the store or the barrier, or
// forwarded and not answered). MetricWritesInFlight reports it.
func (g *Gate) InFlight() int64 {
	return int64(g.inFlight.len())
}

// auditSet is the audit records of the writes in the gate, in shards: each
// a list threaded through its records, under a lock of its own, so that
// adding and removing allocate nothing and writes on different CPUs (the
// event loops) seldom meet at one lock. LogCutOff, which lists them, runs
// once.
type auditSet struct {
	shards [auditShards]auditShard
}

// auditShards is the number of an auditSet's shards.
const auditShards = 8

type auditShard struct {
	mu   sync.Mutex
	head *auditRecord
	n    int
	_    [64 - 24]byte // a cache line of its own
}

// add registers rec, which is in no set, in a shard chosen by its start.
func (s *auditSet) add(rec *auditRecord) {
	sh := &s.shards[uint(rec.start.Nanosecond()>>10)%auditShards]
	sh.mu.Lock()
	rec.shard, rec.prev, rec.next = sh, nil, sh.head
	if sh.head != nil {
		sh.head.prev = rec
	}
	sh.head = rec
	sh.n++
	sh.mu.Unlock()
}

// remove takes rec out of the set, if it is in it.
func (s *auditSet) remove(rec *auditRecord) {
	sh := rec.shard
	if sh == nil {
		return
	}
	sh.mu.Lock()
	if rec.prev != nil {
		rec.prev.next = rec.next
	} else {
		sh.head = rec.next
	}
	if rec.next != nil {
		rec.next.prev = rec.prev
	}
	rec.shard, rec.prev, rec.next = nil, nil, nil
	sh.n--
	sh.mu.Unlock()
}

func (s *auditSet) len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

func (s *auditSet) list() []*auditRecord {
	var recs []*auditRecord
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for r := sh.head; r != nil; r = r.next {
			recs = append(recs, r)
		}
		sh.mu.Unlock()
	}
	return recs
}
