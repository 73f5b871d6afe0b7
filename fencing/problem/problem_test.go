package problem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/fencegate/fencegate/fencing"
)

func TestTable(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   string
		extra  string // an extension member that must be present
	}{
		{&fencing.LeaseHeldError{Resource: "r", Holder: "a", ExpiresAt: time.Now().Add(5 * time.Second)}, 409, "lease-held", "holder"},
		{fmt.Errorf("wrapped: %w", &fencing.StaleTokenError{HighWater: 7}), 409, "stale-token", "high_water_token"},
		{&fencing.TokenNotIssuedError{Issued: 3}, 409, "token-not-issued", "issued_token"},
		{fmt.Errorf("x: %w", fencing.ErrLeaseLost), 409, "lease-lost", ""},
		{fencing.ErrLeaseNotHeld, 409, "lease-not-held", ""},
		{fencing.ErrNoCheckpoint, 404, "no-checkpoint", ""},
		{&fencing.TooLargeError{Size: 10, Limit: 5}, 413, "payload-too-large", ""},
		{&fencing.ValidationError{Field: "owner", Reason: "must not be empty"}, 400, "invalid-request", ""},
		{fmt.Errorf("dial 10.1.2.3:6379: %w", fencing.ErrUnavailable), 503, "store-unavailable", ""},
		{fencing.ErrAmbiguous, 503, "store-unavailable", ""},
		{fencing.ErrStoreLost, 503, "store-unavailable", ""},
		{fmt.Errorf("admit: %w", context.DeadlineExceeded), 503, "store-unavailable", ""},
		{New(403, "write-denied", "no"), 403, "write-denied", ""},
		{errors.New("password=hunter2 at 10.1.2.3"), 500, "internal-error", ""},
	}
	for _, tc := range cases {
		var logs bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&logs, nil))
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/x", nil)
		req = req.WithContext(context.WithValue(req.Context(), middleware.RequestIDKey, "req-77"))
		Write(rec, req, log, tc.err)
		if rec.Code != tc.status {
			t.Errorf("%v: status %d, want %d", tc.err, rec.Code, tc.status)
		}
		if ct := rec.Header().Get("Content-Type"); ct != ContentType {
			t.Errorf("%v: content type %q", tc.err, ct)
		}
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%v: body %q: %v", tc.err, rec.Body, err)
		}
		if body["code"] != tc.code || body["type"] != TypePrefix+tc.code || body["status"] != float64(tc.status) || body["title"] == "" || body["detail"] == "" {
			t.Errorf("%v: body %v", tc.err, body)
		}
		if tc.extra != "" && body[tc.extra] == nil {
			t.Errorf("%v: no %s member in %v", tc.err, tc.extra, body)
		}
		if tc.status >= 500 {
			if strings.Contains(rec.Body.String(), "10.1.2.3") || strings.Contains(rec.Body.String(), "hunter2") {
				t.Errorf("%v: the cause leaked to the client: %s", tc.err, rec.Body)
			}
			if !strings.Contains(logs.String(), tc.err.Error()) || !strings.Contains(logs.String(), `"request_id":"req-77"`) {
				t.Errorf("%v: the cause was not logged with the request id: %s", tc.err, logs.String())
			}
		}
	}
}

func TestRetryAfter(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, httptest.NewRequest("GET", "/", nil), nil, fencing.ErrUnavailable)
	if rec.Header().Get("Retry-After") == "" {
		t.Error("store-unavailable without Retry-After")
	}
	rec = httptest.NewRecorder()
	Write(rec, httptest.NewRequest("GET", "/", nil), nil, &fencing.LeaseHeldError{ExpiresAt: time.Now().Add(90 * time.Second)})
	if got := rec.Header().Get("Retry-After"); got != "90" && got != "89" {
		t.Errorf("lease-held Retry-After %q, want the seconds until expiry", got)
	}
	if rec.Code != http.StatusConflict {
		t.Errorf("status %d", rec.Code)
	}
}

// TestStoreFaultOutcome: store-unavailable says whether the store may have
// done the operation, and its detail agrees.
func TestStoreFaultOutcome(t *testing.T) {
	for _, tc := range []struct {
		err     error
		outcome string
		detail  string // a phrase the detail must carry
	}{
		{fmt.Errorf("dial: %w", fencing.ErrUnavailable), OutcomeNotDone, "nothing was done"},
		{fmt.Errorf("%w: lost", fencing.ErrStoreLost), OutcomeNotDone, "nothing was done"},
		{fmt.Errorf("read: %w", fencing.ErrAmbiguous), OutcomeUnknown, "may or may not have been done"},
		{fmt.Errorf("admit: %w", context.DeadlineExceeded), OutcomeUnknown, "may or may not have been done"},
		// Both: unknown wins, never a false "nothing was done".
		{fmt.Errorf("%w: %w", fencing.ErrUnavailable, fencing.ErrAmbiguous), OutcomeUnknown, "may or may not"},
	} {
		p := From(tc.err)
		if p.Code != "store-unavailable" || p.Extra["outcome"] != tc.outcome || !strings.Contains(p.Detail, tc.detail) {
			t.Errorf("%v: %s outcome %v detail %q; want outcome %s and a detail saying %q", tc.err, p.Code, p.Extra["outcome"], p.Detail, tc.outcome, tc.detail)
		}
		if tc.outcome == OutcomeUnknown && strings.Contains(p.Detail, "nothing was done") {
			t.Errorf("%v: an unknown outcome says nothing was done: %q", tc.err, p.Detail)
		}
	}
}

// TestStaleDetailIsTruthful: a token refused because it predates the
// store's record of the resource (a fresh resource as much as a loss) does
// not claim that a newer write was admitted, nor that data was lost.
func TestStaleDetailIsTruthful(t *testing.T) {
	p := From(&fencing.StaleTokenError{Token: 5, HighWater: 9, BeforeLoss: true})
	if p.Code != "stale-token" || strings.Contains(p.Detail, "newer token was already admitted") ||
		strings.Contains(p.Detail, "before the lease store lost data") || !strings.Contains(p.Detail, "record of this resource began") {
		t.Errorf("floor refusal: %s %q", p.Code, p.Detail)
	}
	p = From(&fencing.StaleTokenError{Token: 5, HighWater: 9})
	if !strings.Contains(p.Detail, "newer token was already admitted") {
		t.Errorf("high-water refusal: %q", p.Detail)
	}
}

// TestLeaseHeldRetryAfterUsesStoreClock: Retry-After is the lease's time
// left by the store's clock, whatever the host's clock says.
func TestLeaseHeldRetryAfterUsesStoreClock(t *testing.T) {
	storeNow := time.Now().Add(-time.Hour) // the store's clock is an hour behind the host's
	p := From(&fencing.LeaseHeldError{Holder: "a", Now: storeNow, ExpiresAt: storeNow.Add(90 * time.Second)})
	if got := p.Headers.Get("Retry-After"); got != "90" {
		t.Fatalf("Retry-After %q, want 90 (by the store's clock)", got)
	}
}

// TestBodyDoesNotEscapeHTML: a detail that names "Bearer <token>" reads as
// written, not as \u003ctoken\u003e.
func TestBodyDoesNotEscapeHTML(t *testing.T) {
	body := string(New(401, "unauthorized", "send Authorization: Bearer <token> & retry").Body())
	if !strings.Contains(body, "Bearer <token> & retry") || strings.Contains(body, `\u003c`) {
		t.Errorf("body %s escapes HTML characters", body)
	}
	if !strings.HasSuffix(body, "}\n") || strings.Count(body, "\n") != 1 {
		t.Errorf("body %q is not one line ending in a newline", body)
	}
}

// A flood of faults logs at most FaultLinesPerSecond "request failed"
// lines a second, and a line after a drop says how many were left out.
func TestLogFaultBounded(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&out, nil))
	p := &Error{Status: http.StatusServiceUnavailable, Code: "store-unavailable", Cause: errors.New("store down")}
	const faults = 5 * FaultLinesPerSecond
	now := time.Unix(1_800_000_000, 0)
	for i := range faults {
		logFaultAt(context.Background(), log, p, fmt.Sprint(i), "PUT", "/jobs/1", now.Add(time.Duration(i)*time.Millisecond))
	}
	// The next second's first fault is logged with the count of those
	// left out.
	logFaultAt(context.Background(), log, p, "after", "PUT", "/jobs/1", now.Add(time.Second))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if n := len(lines); n != FaultLinesPerSecond+1 {
		t.Fatalf("%d lines for %d faults in one second and one in the next, want %d", n, faults, FaultLinesPerSecond+1)
	}
	var last struct {
		Msg        string
		RequestID  string `json:"request_id"`
		Suppressed int
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Msg != "request failed" || last.RequestID != "after" || last.Suppressed != faults-FaultLinesPerSecond {
		t.Errorf("last line %s: want the fault after the flood, with the count of those suppressed", lines[len(lines)-1])
	}
}
