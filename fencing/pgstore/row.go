package pgstore

import (
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

// row is a resources row as scanned after the clock, the found flag, the
// synchronous_commit flag and the standby flag of the read statements (nullable: the join
// yields NULLs for an unknown resource). Its fields follow recordColumns.
type row struct {
	nowUs         int64
	found         bool
	syncOff       bool // the session's synchronous_commit is off
	standby       bool // the statement ran on a server in recovery
	issued, hw    *int64
	owner         *string
	token, ttlMs  *int64
	acquired, exp *time.Time
	released, fin *bool
	priorOwner    *string
	priorToken    *int64
	priorEnded    *string
	priorFinished *bool
	cpToken       *int64
	cpUpdated     *time.Time
	cpSize        *int32
	floor         *int64
	touched       *time.Time
}

// dest lists the scan destinations in the statements' column order.
func (w *row) dest() []any {
	return []any{&w.nowUs, &w.found, &w.syncOff, &w.standby, &w.issued, &w.hw, &w.owner, &w.token, &w.ttlMs, &w.acquired, &w.exp,
		&w.released, &w.fin, &w.priorOwner, &w.priorToken, &w.priorEnded, &w.priorFinished,
		&w.cpToken, &w.cpUpdated, &w.cpSize, &w.floor, &w.touched}
}

// now is the database's clock when it read the row; clock is the same in
// µs, for tokens.
func (w *row) now() time.Time { return time.UnixMicro(w.nowUs).UTC() }

func (w *row) clock() fencing.Token { return fencing.Token(max(w.nowUs, 0)) }

func tok(p *int64) fencing.Token {
	if p == nil || *p < 0 {
		return 0
	}
	return fencing.Token(*p)
}

func i64(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func ms(p *time.Time) int64 {
	if p == nil {
		return 0
	}
	return p.UnixMilli()
}

func flag(p *bool) bool { return p != nil && *p }

// record builds the resource's record.Record (empty when not found).
func (w *row) record() *record.Record {
	r := &record.Record{}
	if !w.found {
		return r
	}
	r.Issued, r.HighWater, r.Floor, r.TouchedMs = tok(w.issued), tok(w.hw), tok(w.floor), ms(w.touched)
	if w.owner != nil {
		r.Last = &record.Lease{Owner: *w.owner, Token: tok(w.token), TTLMillis: i64(w.ttlMs),
			AcquiredMs: ms(w.acquired), ExpiresMs: ms(w.exp), Released: flag(w.released), Finished: flag(w.fin)}
	}
	if w.priorOwner != nil && w.priorEnded != nil {
		r.Prior = &record.Previous{Owner: *w.priorOwner, Token: tok(w.priorToken),
			Ended: fencing.Ending(*w.priorEnded), Finished: flag(w.priorFinished)}
	}
	if w.cpToken != nil {
		var size int
		if w.cpSize != nil {
			size = int(*w.cpSize)
		}
		r.Saved = &record.Checkpoint{Token: tok(w.cpToken), UpdatedMs: ms(w.cpUpdated), SizeBytes: size}
	}
	return r
}

// args are the insert and update statements' parameters for r: $1 the
// resource, then recordColumns in order. Tokens in a record never exceed
// issued, which an int64 holds (issued grows by one per acquisition).
func args(resource string, r *record.Record) []any {
	a := make([]any, 0, 19)
	a = append(a, resource, int64(r.Issued), int64(r.HighWater))
	if l := r.Last; l != nil {
		a = append(a, l.Owner, int64(l.Token), l.TTLMillis, time.UnixMilli(l.AcquiredMs), time.UnixMilli(l.ExpiresMs), l.Released, l.Finished)
	} else {
		a = append(a, nil, nil, nil, nil, nil, false, false)
	}
	if p := r.Prior; p != nil {
		a = append(a, p.Owner, int64(p.Token), string(p.Ended), p.Finished)
	} else {
		a = append(a, nil, nil, nil, false)
	}
	if c := r.Saved; c != nil {
		a = append(a, int64(c.Token), time.UnixMilli(c.UpdatedMs), int32(c.SizeBytes))
	} else {
		a = append(a, nil, nil, nil)
	}
	a = append(a, int64(r.Floor))
	if r.TouchedMs != 0 {
		a = append(a, time.UnixMilli(r.TouchedMs))
	} else {
		a = append(a, nil)
	}
	return a
}
