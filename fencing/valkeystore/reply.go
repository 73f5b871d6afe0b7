package valkeystore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// corrupt reports a reply the scripts never produce. The script ran, so the
// outcome is unknown to the caller.
func corrupt(op string, reply []string) error {
	return fmt.Errorf("%w: %s: unexpected script reply %q", fencing.ErrAmbiguous, op, reply)
}

func parseToken(s string) (fencing.Token, bool) {
	if s == "" {
		return 0, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return fencing.Token(v), err == nil
}

func parseMillis(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// lease parses {token, ttl_ms, acquired_ms, expires_ms}.
func lease(res, owner string, f []string) (fencing.Lease, bool) {
	if len(f) != 4 {
		return fencing.Lease{}, false
	}
	tok, ok1 := parseToken(f[0])
	ttl, ok2 := parseMillis(f[1])
	acq, ok3 := parseMillis(f[2])
	exp, ok4 := parseMillis(f[3])
	if !ok1 || !ok2 || !ok3 || !ok4 || tok == 0 {
		return fencing.Lease{}, false
	}
	return fencing.Lease{Resource: res, Owner: owner, Token: tok, TTL: time.Duration(ttl) * time.Millisecond,
		AcquiredAt: fromMillis(acq), ExpiresAt: fromMillis(exp)}, true
}

// leaseReply decodes the reply of renew.lua and checkpoint.lua.
func leaseReply(op, res, owner string, r []string) (fencing.Lease, error) {
	switch r[0] {
	case "OK":
		if l, ok := lease(res, owner, r[1:]); ok {
			return l, nil
		}
	case "LOST":
		return fencing.Lease{}, leaseLost(res)
	}
	return fencing.Lease{}, corrupt(op, r)
}

// record is a resource's record as read by status.lua and
// readcheckpoint.lua.
type record struct {
	now       int64
	issued    fencing.Token
	highWater fencing.Token
	live      *fencing.Lease
	previous  *fencing.Previous
	saved     *fencing.CheckpointInfo
}

// parseRecord reads the 17 fields of status.lua.
func parseRecord(res string, f []string) (record, bool) {
	if len(f) < 17 {
		return record{}, false
	}
	var r record
	var ok bool
	if r.now, ok = parseMillis(f[0]); !ok {
		return r, false
	}
	if r.issued, ok = parseToken(f[1]); !ok {
		return r, false
	}
	if r.highWater, ok = parseToken(f[2]); !ok {
		return r, false
	}
	owner, rel, fin := f[3], f[8], f[9]
	if owner != "" {
		l, ok := lease(res, owner, f[4:8])
		if !ok {
			return r, false
		}
		if rel != "1" && r.now < l.ExpiresAt.UnixMilli() {
			r.live = &l
		} else {
			ended := fencing.EndExpired
			if rel == "1" {
				ended = fencing.EndReleased
			}
			r.previous = &fencing.Previous{Owner: owner, Token: l.Token, Ended: ended, Finished: fin == "1"}
		}
	}
	if r.previous == nil && f[10] != "" {
		tok, ok := parseToken(f[11])
		if !ok {
			return r, false
		}
		r.previous = &fencing.Previous{Owner: f[10], Token: tok, Ended: fencing.Ending(f[12]), Finished: f[13] == "1"}
	}
	if f[14] != "" {
		tok, ok1 := parseToken(f[14])
		ms, ok2 := parseMillis(f[15])
		size, err := strconv.Atoi(f[16])
		if !ok1 || !ok2 || err != nil {
			return r, false
		}
		r.saved = &fencing.CheckpointInfo{Token: tok, UpdatedAt: fromMillis(ms), SizeBytes: size}
	}
	return r, true
}
