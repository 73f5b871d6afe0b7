package proxy

import (
	"context"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
)

// AuditMessage is the message of the gate's audit log lines: one per
// unsafe request (write), logged at info when its outcome is final (the
// moment it is counted in MetricWrites), with these attributes:
//
//   - request_id, method, path: the request as received (path truncated
//     to 256 bytes);
//   - code: the outcome code of MetricWrites (admitted, stale-token,
//     barrier-timeout, ...);
//   - resource, token: once the gate has worked them out;
//   - high_water, issued: the resource's high-water mark and newest
//     issued token, where the store reported them (on admission, or with
//     stale-token / token-not-issued);
//   - upstream_status: the upstream's answer, for forwarded writes that
//     got one;
//   - duration_ms: from the gate receiving the request to the outcome.
const AuditMessage = "gate write"

// CutOffMessage is the message of the warning LogCutOff writes for each
// write still in flight when the shutdown grace ends.
const CutOffMessage = "write cut off at shutdown"

// Audit configures the audit log. The zero value logs every write.
type Audit struct {
	// Off turns the audit lines off. LogCutOff still lists cut-off writes.
	Off bool
	// Sample, when in (0, 1), is the fraction of successful writes
	// (admitted, unfenced) that are logged, chosen at random, for a busy
	// gate; 0 or 1 logs them all. Refused and failed writes are always
	// logged.
	Sample float64
}

// auditRecord is what the audit line of one write says. Its fields are
// written by the request's handler only; LogCutOff reads them from another
// goroutine, hence the lock. A nil *auditRecord (a read) records nothing.
type auditRecord struct {
	mu                      sync.Mutex
	start                   time.Time
	id, method, path        string
	resource                string
	token, highWater, issue fencing.Token
	status                  int
}

// openAudit gives a write an audit record and registers it as in flight
// until closeAudit.
func (g *Gate) openAudit(x *exchange) {
	p := x.path
	if len(p) > 256 {
		p = p[:256]
	}
	x.auditRec = auditRecord{start: x.start, id: x.id, method: x.method, path: p}
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

// problem records the marks a refusal reports (stale-token carries the
// high-water mark, token-not-issued the newest issued token).
func (rec *auditRecord) problem(p *problem.Error) {
	if rec == nil {
		return
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
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
	if x.audit == nil || g.audit.Off {
		return
	}
	if s := g.audit.Sample; s > 0 && s < 1 && (code == CodeAdmitted || code == CodeUnfenced) && rand.Float64() >= s {
		return
	}
	if !g.log.Enabled(x.ctx, slog.LevelInfo) {
		return
	}
	g.log.LogAttrs(x.ctx, slog.LevelInfo, AuditMessage, x.audit.attrs(code)...)
}

// attrs are the audit line's attributes.
func (rec *auditRecord) attrs(code string) []slog.Attr {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	a := make([]slog.Attr, 0, 11)
	a = append(a, slog.String("request_id", rec.id), slog.String("method", rec.method),
		slog.String("path", rec.path), slog.String("code", code))
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
// Audit.Off.
func (g *Gate) LogCutOff() int {
	recs := g.inFlight.list()
	for _, rec := range recs {
		g.log.LogAttrs(context.Background(), slog.LevelWarn, CutOffMessage, rec.attrs("cut-off")...)
	}
	return len(recs)
}

// auditSet is the audit records of the writes in the gate. A map under a
// lock, not a sync.Map: adding and removing allocate nothing once the map
// has grown, and LogCutOff, which lists them, runs once.
type auditSet struct {
	mu   sync.Mutex
	recs map[*auditRecord]struct{}
}

func (s *auditSet) add(rec *auditRecord) {
	s.mu.Lock()
	if s.recs == nil {
		s.recs = make(map[*auditRecord]struct{})
	}
	s.recs[rec] = struct{}{}
	s.mu.Unlock()
}

func (s *auditSet) remove(rec *auditRecord) {
	s.mu.Lock()
	delete(s.recs, rec)
	s.mu.Unlock()
}

func (s *auditSet) list() []*auditRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.recs))
}
