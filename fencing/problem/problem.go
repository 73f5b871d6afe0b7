// Package problem renders errors as RFC 9457 application/problem+json
// bodies. It holds the one table from fencing errors to HTTP status and
// stable code, shared by the lease API and the write gate, and the one
// writer every error response goes through.
//
// Unknown errors become 500 "internal error": the cause is logged beside the
// request id and never sent to the client.
package problem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/reqid"
	"github.com/fencegate/fencegate/internal/loglimit"
)

// ContentType is the media type of every error body.
const ContentType = "application/problem+json"

// TypePrefix starts every problem type URI; the code follows it.
const TypePrefix = "urn:fencegate:problem:"

// RetryAfterStoreFault is the Retry-After, in seconds, sent with
// store-unavailable.
const RetryAfterStoreFault = 1

// Error is a problem to send as is: a status, a stable code, a detail for
// humans, and optional extension members and headers.
type Error struct {
	Status  int
	Code    string
	Detail  string
	Extra   map[string]any // extension members, snake_case keys
	Headers http.Header    // extra response headers (Retry-After, WWW-Authenticate)
	Cause   error          // logged, never sent
}

func (e *Error) Error() string { return e.Code + ": " + e.Detail }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// New returns a problem with the given status, code and detail.
func New(status int, code, detail string) *Error {
	return &Error{Status: status, Code: code, Detail: detail}
}

// From classifies err into the problem to send: the one error-to-status
// table. A *Error is returned as is.
func From(err error) *Error {
	var p *Error
	if errors.As(err, &p) {
		return p
	}
	var (
		held     *fencing.LeaseHeldError
		stale    *fencing.StaleTokenError
		notIssue *fencing.TokenNotIssuedError
	)
	switch {
	case errors.As(err, &held):
		retry := max(int(held.Remaining().Seconds()+0.999), 1)
		return &Error{Status: http.StatusConflict, Code: "lease-held", Detail: "the lease is held by another owner",
			Extra:   map[string]any{"holder": held.Holder, "expires_at": FormatTime(held.ExpiresAt)},
			Headers: http.Header{"Retry-After": {strconv.Itoa(retry)}}}
	case errors.As(err, &stale) && stale.BeforeLoss:
		return &Error{Status: http.StatusConflict, Code: "stale-token",
			Detail: "the token was issued before the lease store's record of this resource began (a new store, a record removed or restored, or data the store lost); tokens from high_water_token on are admitted: acquire again",
			Extra:  map[string]any{"high_water_token": stale.HighWater}}
	case errors.As(err, &stale):
		return &Error{Status: http.StatusConflict, Code: "stale-token", Detail: "a write with a newer token was already admitted for this resource",
			Extra: map[string]any{"high_water_token": stale.HighWater}}
	case errors.As(err, &notIssue):
		return &Error{Status: http.StatusConflict, Code: "token-not-issued", Detail: "the token is above every token issued for this resource",
			Extra: map[string]any{"issued_token": notIssue.Issued}}
	case errors.Is(err, fencing.ErrLeaseLost):
		return New(http.StatusConflict, "lease-lost", "the caller does not hold the live lease (wrong owner or token, expired or released)")
	case errors.Is(err, fencing.ErrLeaseNotHeld):
		return New(http.StatusConflict, "lease-not-held", "no live lease on this resource holds the token")
	case errors.Is(err, fencing.ErrNoCheckpoint):
		return New(http.StatusNotFound, "no-checkpoint", "the resource has no checkpoint")
	case errors.Is(err, fencing.ErrTooLarge):
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "payload-too-large", Detail: err.Error()}
	case errors.Is(err, fencing.ErrInvalid):
		return New(http.StatusBadRequest, "invalid-request", err.Error())
	case errors.Is(err, fencing.ErrStoreLost):
		return storeFault(OutcomeNotDone, "the lease store lost data for this resource and has moved it past every token issued before the loss; "+
			"nothing was done: tokens issued before the loss are refused, acquire again", err)
	case errors.Is(err, fencing.ErrAmbiguous), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// A bare context error reaching here (the caller's own request is
		// still live, or its handler would not answer) came from a store
		// that gave up without classifying it: the outcome is unknown.
		return storeFault(OutcomeUnknown, "the lease store did not answer after the request was sent: it may or may not have been done "+
			"(an acquire may have taken the lease: acquire again as the same owner; a write through the gate was not forwarded); retry later", err)
	case errors.Is(err, fencing.ErrUnavailable):
		return storeFault(OutcomeNotDone, "the lease store could not be reached; nothing was done, retry later", err)
	}
	return &Error{Status: http.StatusInternalServerError, Code: "internal-error", Detail: "internal error", Cause: err}
}

// The outcome member of store-unavailable: whether the store may have
// performed the operation.
const (
	// OutcomeNotDone: the store did not perform it (it was not reached,
	// or it refused before changing anything).
	OutcomeNotDone = "not-done"
	// OutcomeUnknown: the request reached the store, but no answer came
	// back; it may or may not have taken effect.
	OutcomeUnknown = "unknown"
)

// storeFault is the store-unavailable problem with its outcome member.
func storeFault(outcome, detail string, cause error) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: "store-unavailable", Detail: detail,
		Extra:   map[string]any{"outcome": outcome},
		Headers: http.Header{"Retry-After": {strconv.Itoa(RetryAfterStoreFault)}}, Cause: cause}
}

// Write sends err as a problem+json response: type, title, status, detail
// and code, plus the problem's extension members. Causes of internal errors and
// store faults are logged with the request id; their text is not sent.
func Write(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	p := From(err)
	LogFault(r.Context(), log, p, reqid.From(r), r.Method, r.URL.Path)
	h := w.Header()
	for k, vs := range p.Headers {
		h[k] = vs
	}
	h.Set("Content-Type", ContentType)
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.Body())
}

// Body is p's problem+json body: type, title, status, detail and code,
// plus p's extension members, ending in a newline.
func (p *Error) Body() []byte {
	m := make(map[string]any, 5+len(p.Extra))
	for k, v := range p.Extra {
		m[k] = v
	}
	m["type"] = TypePrefix + p.Code
	m["title"] = Title(p.Status)
	m["status"] = p.Status
	m["detail"] = p.Detail
	m["code"] = p.Code
	b, err := marshal(m)
	if err != nil { // an extension member that does not marshal
		b, _ = marshal(map[string]any{"type": TypePrefix + p.Code, "title": Title(p.Status),
			"status": p.Status, "detail": p.Detail, "code": p.Code})
	}
	return b
}

// marshal encodes v on one line ending in a newline, without escaping <, >
// and & (a detail such as "Bearer <token>" reads as written: problem
// bodies are JSON, never HTML).
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// TooManyConnections is the answer of a server to a connection beyond its
// cap, written before any request is read from it.
func TooManyConnections() *Error {
	p := New(http.StatusServiceUnavailable, "too-many-connections", "the server has too many open connections; retry later")
	p.Headers = http.Header{"Retry-After": {"1"}}
	return p
}

// Response is p as a whole HTTP/1.1 response that closes its connection
// (status line, p's headers, Content-Type, Content-Length, body), for a
// server to write on a raw connection before or instead of reading a
// request from it.
func (p *Error) Response() []byte {
	body := p.Body()
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", p.Status, Title(p.Status))
	for k, vs := range p.Headers {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	fmt.Fprintf(&b, "Content-Type: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", ContentType, len(body))
	b.Write(body)
	return b.Bytes()
}

// FaultLinesPerSecond bounds the "request failed" lines LogFault writes,
// over the whole process: during an outage (the store down, the upstream
// unreachable) every request a client sends is a fault, and one line each
// would let any client fill the log's disk. The next line after a drop
// carries how many were left out ("suppressed"); metrics count them all.
const FaultLinesPerSecond = 20

// faultLines is the process's budget of LogFault lines.
var faultLines = loglimit.Limiter{PerSecond: FaultLinesPerSecond}

// LogFault logs the cause of a server-side problem (status 500 and up)
// with the request it failed: its id, method and path, at most
// FaultLinesPerSecond lines a second. Other problems, and problems without
// a cause, are not logged.
func LogFault(ctx context.Context, log *slog.Logger, p *Error, id, method, path string) {
	logFaultAt(ctx, log, p, id, method, path, time.Now())
}

// logFaultAt is LogFault at now, the limiter's clock.
func logFaultAt(ctx context.Context, log *slog.Logger, p *Error, id, method, path string, now time.Time) {
	if p.Cause == nil || log == nil || p.Status < 500 {
		return
	}
	ok, suppressed := faultLines.Allow(now)
	if !ok {
		return
	}
	attrs := []slog.Attr{
		slog.String("request_id", id),
		slog.String("code", p.Code), slog.String("method", method), slog.String("path", path),
		slog.String("error", p.Cause.Error()),
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("suppressed", suppressed))
	}
	for k, v := range p.Extra {
		attrs = append(attrs, slog.Any(k, v))
	}
	log.LogAttrs(ctx, slog.LevelError, "request failed", attrs...)
}

// Title is the problem title for a status: its HTTP reason phrase.
func Title(status int) string {
	if t := http.StatusText(status); t != "" {
		return t
	}
	return "Error"
}

// FormatTime renders t the way the API does: RFC 3339 UTC with milliseconds.
func FormatTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
