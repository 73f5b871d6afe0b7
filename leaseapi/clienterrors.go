package leaseapi

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
)

// The errors a Client returns: the server's refusals (ProblemError, which
// matches the fencing and leaseapi sentinels), an answer it cannot use
// (ErrBadAnswer), and a round trip that failed before (ErrUnreachable) or
// after (ErrAmbiguous) it may have reached the API.

// ErrBadAnswer matches a call answered 2xx with a body the client cannot
// use: cut off, larger than MaxAnswerBytes, or not the JSON document the
// lease API sends. The server at the base URL is likely not fencegate's
// lease API (a wrong URL), or something between mangled the answer. Such
// an error also matches fencing.ErrAmbiguous: a 2xx may mean the call took
// effect.
var ErrBadAnswer = errors.New("unusable answer from the lease API")

// badAnswerError is a 2xx answer that could not be used: ErrBadAnswer
// and fencing.ErrAmbiguous, with the cause when there is one.
type badAnswerError struct {
	status int
	what   string
	err    error
}

func (e *badAnswerError) Error() string {
	msg := fmt.Sprintf("%s: it answered %d but %s", ErrBadAnswer, e.status, e.what)
	if e.err != nil {
		msg += ": " + e.err.Error()
	}
	return msg
}

func (e *badAnswerError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrBadAnswer, fencing.ErrAmbiguous}
	}
	return []error{ErrBadAnswer, fencing.ErrAmbiguous, e.err}
}

// transportError classifies a failed round trip: a failed dial, or a TLS
// handshake in which this side refused the server's certificate, sent
// nothing (ErrUnavailable); anything later may have reached the server
// (ErrAmbiguous), and is named as the API's silence, not the store's. A
// TLS alert from the server stays ambiguous: it may refuse the client's
// certificate (nothing done), but it may also come after a request was
// read, from the server or a proxy in front of it.
func transportError(method, path string, err error) error {
	var op *net.OpError
	var verify *tls.CertificateVerificationError
	if errors.As(err, &op) && op.Op == "dial" || errors.As(err, &verify) {
		return fmt.Errorf("leaseapi: %s %s: %w", method, path, &unreachableError{err: err})
	}
	return fmt.Errorf("leaseapi: %s %s: %w", method, path, &noAnswerError{err: err})
}

// noAnswerError is a round trip that failed after it may have reached the
// lease API (a timeout, a connection lost, the caller giving up): it
// matches fencing.ErrAmbiguous, since the call may have taken effect, but
// says that the API did not answer; the store may never have been asked.
type noAnswerError struct{ err error }

func (e *noAnswerError) Error() string {
	return "no answer from the lease API (the call may have taken effect): " + e.err.Error()
}
func (e *noAnswerError) Unwrap() []error { return []error{fencing.ErrAmbiguous, e.err} }

// ErrUnreachable matches a call that could not connect to the lease API
// at all (connection refused, no route, DNS failure): nothing was done.
// Such an error also matches fencing.ErrUnavailable, so code that retries
// on an unavailable store retries on it too; its message names the API,
// not the store, because the store was never asked.
var ErrUnreachable = errors.New("lease API unreachable")

// unreachableError is a failed dial: ErrUnreachable and
// fencing.ErrUnavailable, with the dial's own error.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return ErrUnreachable.Error() + ": " + e.err.Error() }
func (e *unreachableError) Unwrap() []error {
	return []error{ErrUnreachable, fencing.ErrUnavailable, e.err}
}

// ProblemError is a refusal answered by the server: a non-2xx status with,
// normally, an application/problem+json body.
type ProblemError struct {
	Status int    // HTTP status
	Code   string // the problem's stable code ("lease-held"); empty when the body was not a problem
	// Type is the problem's type URI ("urn:fencegate:problem:lease-held");
	// empty when the body was not a problem.
	Type   string
	Detail string // the problem's detail, for humans
	// Extra holds the problem's extension members ("holder", "expires_at",
	// "high_water_token"...). Numbers are json.Number, so tokens keep
	// every digit.
	Extra map[string]any
	// RetryAfter is the answer's Retry-After, when it gave one in seconds.
	RetryAfter time.Duration
	// Resource is the resource the call was about (empty for List).
	Resource string
	// Body is the problem document as the server sent it, when the answer
	// was JSON (nil otherwise).
	Body json.RawMessage
}

// Error renders the status, code and detail.
func (e *ProblemError) Error() string {
	code := e.Code
	if code == "" {
		code = strings.ToLower(http.StatusText(e.Status))
	}
	if e.Detail == "" {
		return fmt.Sprintf("fencegate: %d %s", e.Status, code)
	}
	return fmt.Sprintf("fencegate: %d %s: %s", e.Status, code, e.Detail)
}

// FromAPI reports whether the answer is a problem document of fencegate's
// API: a code, and the type urn:fencegate:problem:<code>. Any other non-2xx
// answer (a proxy's error page, another server at a wrong URL, a JSON error
// of another API) says nothing about leases: it is not a refusal by the
// lease API, whatever its status.
func (e *ProblemError) FromAPI() bool {
	return e.Code != "" && e.Type == problem.TypePrefix+e.Code
}

// ErrUnauthorized matches a *ProblemError with code "unauthorized": the
// server requires an API token and the client sent none or a wrong one (see
// WithToken).
var ErrUnauthorized = errors.New("unauthorized")

// ErrForbidden matches a *ProblemError with code "forbidden": the server's
// access file (FENCEGATE_ACCESS_FILE) knows the client but does not allow
// it this operation on this resource, or, with bind_owner, this owner.
// Nothing was done; retrying cannot change the answer.
var ErrForbidden = errors.New("forbidden")

// sentinels maps problem codes to the errors they stand for.
var sentinels = map[string]error{
	"unauthorized":      ErrUnauthorized,
	"forbidden":         ErrForbidden,
	"invalid-request":   fencing.ErrInvalid,
	"invalid-json":      fencing.ErrInvalid,
	"payload-too-large": fencing.ErrTooLarge,
	"lease-held":        fencing.ErrLeaseHeld,
	"lease-lost":        fencing.ErrLeaseLost,
	"stale-token":       fencing.ErrStaleToken,
	"token-not-issued":  fencing.ErrTokenNotIssued,
	"lease-not-held":    fencing.ErrLeaseNotHeld,
	"no-checkpoint":     fencing.ErrNoCheckpoint,
	"store-unavailable": fencing.ErrUnavailable,
}

// Is makes errors.Is(err, fencing.ErrLeaseLost) and the like true for the
// matching problem code: invalid-request and invalid-json match
// fencing.ErrInvalid, payload-too-large ErrTooLarge, lease-held
// ErrLeaseHeld, lease-lost ErrLeaseLost, stale-token ErrStaleToken,
// token-not-issued ErrTokenNotIssued, lease-not-held ErrLeaseNotHeld,
// no-checkpoint ErrNoCheckpoint, store-unavailable ErrUnavailable (nothing
// was done) or, when its outcome member is "unknown", ErrAmbiguous (the
// call may have taken effect), unauthorized ErrUnauthorized and forbidden
// ErrForbidden.
func (e *ProblemError) Is(target error) bool {
	if e.Code == "store-unavailable" && e.Extra["outcome"] == "unknown" {
		return target == fencing.ErrAmbiguous
	}
	s, ok := sentinels[e.Code]
	return ok && s == target
}

// As fills *fencing.LeaseHeldError, *fencing.StaleTokenError and
// *fencing.TokenNotIssuedError from the matching problems' members.
func (e *ProblemError) As(target any) bool {
	switch t := target.(type) {
	case **fencing.LeaseHeldError:
		if e.Code != "lease-held" {
			return false
		}
		holder, _ := e.Extra["holder"].(string)
		var exp time.Time
		if s, ok := e.Extra["expires_at"].(string); ok {
			exp, _ = parseTime(s)
		}
		*t = &fencing.LeaseHeldError{Resource: e.Resource, Holder: holder, ExpiresAt: exp}
		return true
	case **fencing.StaleTokenError:
		if e.Code != "stale-token" {
			return false
		}
		*t = &fencing.StaleTokenError{Resource: e.Resource, HighWater: e.token("high_water_token")}
		return true
	case **fencing.TokenNotIssuedError:
		if e.Code != "token-not-issued" {
			return false
		}
		*t = &fencing.TokenNotIssuedError{Resource: e.Resource, Issued: e.token("issued_token")}
		return true
	}
	return false
}

func (e *ProblemError) token(member string) fencing.Token {
	n, ok := e.Extra[member].(json.Number)
	if !ok {
		return 0
	}
	t, _ := fencing.ParseToken(n.String())
	return t
}

// readProblem builds the *ProblemError of a non-2xx answer. A body that is
// not problem JSON (a proxy's error page) leaves Code empty.
func readProblem(resp *http.Response, body io.Reader, resource string) error {
	pe := &ProblemError{Status: resp.StatusCode, Resource: resource}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		pe.RetryAfter = time.Duration(s) * time.Second
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/problem+json" && mt != "application/json" {
		if resp.StatusCode == http.StatusBadRequest && resp.Request != nil && resp.Request.URL.Scheme == "http" {
			// Go's TLS servers (fencegate's HTTPS listeners among them)
			// answer a cleartext request so.
			head, _ := io.ReadAll(io.LimitReader(body, 512))
			if bytes.Contains(head, []byte("HTTP request to an HTTPS server")) {
				pe.Detail = "the server speaks HTTPS: use an https:// URL"
			}
		}
		return pe
	}
	raw, err := io.ReadAll(io.LimitReader(body, maxProblemBytes))
	if err != nil {
		return pe
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return pe
	}
	pe.Body = raw
	pe.Code, _ = m["code"].(string)
	pe.Type, _ = m["type"].(string)
	pe.Detail, _ = m["detail"].(string)
	for _, k := range []string{"type", "title", "status", "detail", "code"} {
		delete(m, k)
	}
	if len(m) > 0 {
		pe.Extra = m
	}
	return pe
}
