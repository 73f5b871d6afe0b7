package leaseapi

import (
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/fencing/reqid"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// fail answers err as a problem. When the client has gone away (its
// context ended and the error is that context's), nothing is written and
// nothing is logged as an error: there is no one to answer.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if ctxErr := r.Context().Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "client gone",
			slog.String("request_id", reqid.From(r)), slog.String("path", r.URL.Path))
		return
	}
	p := problem.From(err)
	if p.Code == "forbidden" || p.Code == "unauthorized" {
		// 401 here: a waiting acquisition's client removed by a reload
		// (recheck); authenticate logs its own.
		s.logRefusal(r, p)
	}
	s.countRefusal(r, p.Code)
	problem.Write(w, r, s.log, p)
}

// permit refuses, with 403 forbidden, a call of an access client outside
// its permissions: op on resource, and, with bind_owner, the owner it
// names. Without an access file everything is permitted.
func permit(r *http.Request, op access.Op, resource string) error {
	c := client(r)
	if c == nil || c.Allows(op, resource) {
		return nil
	}
	return forbidden(c, string(op)+" this resource")
}

// permitOwner refuses an owner a bind_owner client may not name.
func permitOwner(r *http.Request, owner string) error {
	c := client(r)
	if c == nil || c.OwnerAllowed(owner) {
		return nil
	}
	return forbidden(c, "act as this owner (bind_owner: an owner must be "+c.Name+" or begin with "+c.Name+"/)")
}

// resourceCall serves one call on the resource name, already taken from
// the path and validated. It returns the answer to send as 200 JSON, or the
// error to send as a problem; it writes nothing itself (w is only for
// bounding the request body).
type resourceCall func(w http.ResponseWriter, r *http.Request, name string) (any, error)

// onResource adapts a resourceCall of operation op: an invalid {resource},
// or one the access client may not op, is refused before the call runs,
// and the call's answer or error is written.
func (s *Server) onResource(op access.Op, call resourceCall) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, err := query(r, nil)
		var name string
		if err == nil {
			name, err = resource(r)
		}
		if err == nil {
			err = permit(r, op, name)
		}
		var out any
		if err == nil {
			out, err = call(w, r, name)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, out)
	}
}

// resource returns the {resource} path parameter, percent-decoded once and
// validated. chi matches the raw path when the request's path has escapes
// that its decoded form would not repeat (r.URL.RawPath is set), and the
// decoded path otherwise: only in the first case is the parameter still
// encoded. Decoding it in both would decode job:%2541 twice, to job:A,
// where a proxy in front, decoding once, saw job:%41.
func resource(r *http.Request) (string, error) {
	name := chi.URLParam(r, "resource")
	if r.URL.RawPath != "" {
		var err error
		if name, err = url.PathUnescape(name); err != nil {
			return "", &fencing.ValidationError{Field: "resource", Reason: "is not a valid percent-encoded path segment"}
		}
	}
	if err := fencing.ValidateResource(name); err != nil {
		return "", err
	}
	return name, nil
}

// listParams are the query parameters of GET /v1/leases; every other /v1
// call takes none.
var listParams = []string{"prefix", "limit", "cursor"}

// query parses r's query string strictly: every parameter must be one of
// allowed and appear once, and every pair must be well formed. Like an
// unknown JSON member, a typo (?prefx=), a parameter the call does not take
// (?ttl_seconds= on acquire), a malformed pair (?prefix=%ZZ) or a ';'
// separator, each of which url.Values would drop or let the first of two
// win, is refused instead of silently ignored: a listing would otherwise
// list everything, an acquisition take the default TTL.
func query(r *http.Request, allowed []string) (url.Values, error) {
	if r.URL.RawQuery == "" {
		return nil, nil // the usual call: nothing to parse, no map made
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, &fencing.ValidationError{Field: "query", Reason: "is not a valid query string: " + err.Error()}
	}
	names := slices.Sorted(maps.Keys(q)) // the first fault, the same one each time
	for _, name := range names {
		field := name
		if field == "" {
			field = "query"
		}
		if !slices.Contains(allowed, name) {
			reason := "is not a query parameter of this call (it takes none)"
			if len(allowed) > 0 {
				reason = "is not a query parameter of this call (use " + strings.Join(allowed, ", ") + ")"
			}
			return nil, &fencing.ValidationError{Field: field, Reason: reason}
		}
		if len(q[name]) > 1 {
			return nil, &fencing.ValidationError{Field: field, Reason: "must be given once"}
		}
	}
	return q, nil
}

func (s *Server) handleLivez(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]string{"status": "ok"})
}

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		problem.Write(w, r, nil, problem.New(http.StatusServiceUnavailable, "draining", "fencegate is shutting down"))
		return
	}
	if err := s.ping(r.Context()); err != nil {
		if s.unready.CompareAndSwap(false, true) {
			s.log.LogAttrs(r.Context(), slog.LevelError, "not ready: the lease store did not answer; logged again only when it answers",
				slog.String("request_id", reqid.From(r)), slog.String("error", err.Error()))
		}
		// Logged above, once per state change: a probe every few
		// seconds must not log an error every few seconds.
		if s.readyNoStore {
			writeJSON(w, map[string]string{"status": "ready", "store": "unavailable"})
			return
		}
		problem.Write(w, r, nil, &problem.Error{Status: http.StatusServiceUnavailable, Code: "store-unavailable",
			Detail:  "the lease store did not answer",
			Headers: http.Header{"Retry-After": {strconv.Itoa(problem.RetryAfterStoreFault)}}, Cause: err})
		return
	}
	if s.unready.CompareAndSwap(true, false) {
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "ready again: the lease store answers")
	}
	writeJSON(w, map[string]string{"status": "ready"})
}

// The calls below leave the bounds of owner, token and state to the store,
// which validates every request before it changes anything (see
// fencing.Store); they check here only what the store never sees: the
// body's shape and the optional seconds.

func (s *Server) handleAcquire(w http.ResponseWriter, r *http.Request, name string) (any, error) {
	var body acquireBody
	hold, err := s.decodeBody(w, r, LeaseBodyLimit, &body)
	if err != nil {
		return nil, err
	}
	hold.release() // the decoded body holds none of its bytes
	if err := permitOwner(r, body.Owner); err != nil {
		return nil, err
	}
	ttl, err := seconds(body.TTLSeconds, s.defaultTTL, fencing.MaxTTL, fencing.ValidateTTL)
	if err != nil {
		return nil, err
	}
	wait, err := seconds(body.WaitSeconds, 0, fencing.MaxWait, fencing.ValidateWait)
	if err != nil {
		return nil, err
	}
	req := fencing.AcquireRequest{Resource: name, Owner: body.Owner, TTL: ttl}
	var lease fencing.Lease
	if s.waitingEnded() {
		wait = 0 // stopping: answered at once (EndWaits)
	}
	if wait > 0 {
		if client := limitKey(r); s.waitSlots.take(client) {
			defer s.waitSlots.give(client)
		} else {
			wait = 0 // no slot to wait in: answered at once (waitslots.go)
		}
	}
	if wait > 0 {
		// Each try after a wait is checked again under the access policy
		// in force then: the wait may outlast a reload that removed the
		// client or narrowed what it may do, which then gets the refusal
		// a fresh call would, before any lease is taken for it.
		lease, err = s.acquireWait(r.Context(), req, wait, func() error {
			return s.recheck(r, access.Acquire, name, body.Owner)
		})
	} else {
		lease, err = s.store.Acquire(r.Context(), req)
	}
	if err != nil {
		return nil, err
	}
	return toLeaseJSON(lease), nil
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request, name string) (any, error) {
	var body renewBody
	hold, err := s.decodeBody(w, r, LeaseBodyLimit, &body)
	if err != nil {
		return nil, err
	}
	hold.release() // the decoded body holds none of its bytes
	if err := permitOwner(r, body.Owner); err != nil {
		return nil, err
	}
	ttl, err := seconds(body.TTLSeconds, 0, fencing.MaxTTL, fencing.ValidateTTL)
	if err != nil {
		return nil, err
	}
	lease, err := s.store.Renew(r.Context(), fencing.RenewRequest{Resource: name, Owner: body.Owner, Token: body.Token, TTL: ttl})
	if err != nil {
		return nil, err
	}
	return toLeaseJSON(lease), nil
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request, name string) (any, error) {
	var body releaseBody
	hold, err := s.decodeBody(w, r, LeaseBodyLimit, &body)
	if err != nil {
		return nil, err
	}
	hold.release() // the decoded body holds none of its bytes
	if err := permitOwner(r, body.Owner); err != nil {
		return nil, err
	}
	released, err := s.store.Release(r.Context(), fencing.ReleaseRequest{Resource: name, Owner: body.Owner, Token: body.Token, Finished: body.Finished})
	if err != nil {
		return nil, err
	}
	if released {
		s.waiters.freed(name) // the next waiter here tries at once
	}
	return releasedJSON{Released: released}, nil
}

func (s *Server) handleCheckpoint(w http.ResponseWriter, r *http.Request, name string) (any, error) {
	var body checkpointBody
	hold, err := s.decodeBody(w, r, s.checkpointLimit, &body)
	if err != nil {
		return nil, err
	}
	defer hold.release()
	if string(body.State) == "null" {
		body.State = nil // a JSON null member counts as absent: refused below
	}
	if err := permitOwner(r, body.Owner); err != nil {
		return nil, err
	}
	lease, err := s.store.Checkpoint(r.Context(), fencing.CheckpointRequest{Resource: name, Owner: body.Owner, Token: body.Token, State: body.State})
	if err != nil {
		return nil, err
	}
	return toLeaseJSON(lease), nil
}

func (s *Server) handleReadCheckpoint(w http.ResponseWriter, r *http.Request, name string) (any, error) {
	cp, err := s.store.ReadCheckpoint(r.Context(), name)
	if err != nil {
		return nil, err
	}
	return checkpointJSON{State: cp.State, Token: cp.Token, UpdatedAt: problem.FormatTime(cp.UpdatedAt), Previous: toPreviousJSON(cp.Previous)}, nil
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request, name string) (any, error) {
	st, err := s.store.Status(r.Context(), name)
	if err != nil {
		return nil, err
	}
	return toStatusJSON(st), nil
}

// handleList answers one page of the live leases. limit is 1 to
// fencing.MaxListLimit (absent or empty: MaxListLimit); prefix is empty or
// a resource name prefix, which the store validates; cursor is empty or a
// next_cursor this API answered. A page as long as the limit carries a
// next_cursor (the page after it may be empty); a shorter one is the last.
func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	q, err := query(r, listParams)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req := fencing.ListRequest{Prefix: q.Get("prefix")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > fencing.MaxListLimit {
			s.fail(w, r, &fencing.ValidationError{Field: "limit", Reason: "must be an integer between 1 and " + strconv.Itoa(fencing.MaxListLimit)})
			return
		}
		req.Limit = n
	}
	if c := q.Get("cursor"); c != "" {
		after, err := decodeCursor(c)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		req.After = after
	}
	leases, err := s.list(r, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := listJSON{Leases: make([]leaseJSON, 0, len(leases))}
	for _, l := range leases {
		out.Leases = append(out.Leases, toLeaseJSON(l))
	}
	if len(leases) > 0 && len(leases) >= req.EffectiveLimit() {
		next := encodeCursor(leases[len(leases)-1].Resource)
		out.NextCursor = &next
	}
	writeJSON(w, out)
}

// list lists the live leases of req that the request's access client may
// read (all of them without an access file). A request prefix under one
// the client may read is listed as asked; otherwise each of the client's
// read prefixes under the request's is listed, and the answers merged in
// name order up to the limit. A client may thus list "" and see its own
// prefixes' leases, and nothing else.
func (s *Server) list(r *http.Request, req fencing.ListRequest) ([]fencing.Lease, error) {
	c := client(r)
	if c == nil {
		return s.store.List(r.Context(), req)
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	prefixes := c.ReadPrefixes()
	for _, p := range prefixes {
		if strings.HasPrefix(req.Prefix, p) {
			return s.store.List(r.Context(), req)
		}
	}
	limit := req.Limit
	if limit == 0 {
		limit = fencing.MaxListLimit
	}
	var out []fencing.Lease
	for _, p := range prefixes {
		if !strings.HasPrefix(p, req.Prefix) {
			continue
		}
		ls, err := s.store.List(r.Context(), fencing.ListRequest{Prefix: p, Limit: req.Limit, After: req.After})
		if err != nil {
			return nil, err
		}
		out = append(out, ls...)
	}
	slices.SortFunc(out, func(a, b fencing.Lease) int { return strings.Compare(a.Resource, b.Resource) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
