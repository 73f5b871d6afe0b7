package fencing_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// TestTypedErrorsMatchSentinels checks that every typed error matches its
// sentinel, and only its sentinel, even when wrapped.
func TestTypedErrorsMatchSentinels(t *testing.T) {
	sentinels := []error{fencing.ErrInvalid, fencing.ErrTooLarge, fencing.ErrLeaseHeld, fencing.ErrLeaseLost, fencing.ErrStaleToken, fencing.ErrTokenNotIssued, fencing.ErrLeaseNotHeld, fencing.ErrNoCheckpoint, fencing.ErrUnavailable, fencing.ErrAmbiguous, fencing.ErrStoreLost}
	typed := map[error]error{
		&fencing.ValidationError{Field: "owner", Reason: "must not be empty"}:           fencing.ErrInvalid,
		&fencing.TooLargeError{Size: 2, Limit: 1}:                                       fencing.ErrTooLarge,
		&fencing.LeaseHeldError{Resource: "r", Holder: "h", ExpiresAt: time.Unix(0, 0)}: fencing.ErrLeaseHeld,
		&fencing.StaleTokenError{Resource: "r", Token: 1, HighWater: 2}:                 fencing.ErrStaleToken,
		&fencing.TokenNotIssuedError{Resource: "r", Token: 3, Issued: 2}:                fencing.ErrTokenNotIssued,
	}
	for err, want := range typed {
		wrapped := fmt.Errorf("context: %w", err)
		for _, s := range sentinels {
			if got := errors.Is(wrapped, s); got != (s == want) {
				t.Errorf("errors.Is(%T, %v) = %v", err, s, got)
			}
		}
		if err.Error() == "" {
			t.Errorf("%T has an empty message", err)
		}
		if fencing.IsStoreFault(wrapped) {
			t.Errorf("%T counted as a store fault", err)
		}
	}
	for _, fault := range []error{fencing.ErrUnavailable, fencing.ErrAmbiguous, fencing.ErrStoreLost} {
		if !fencing.IsStoreFault(fmt.Errorf("x: %w", fault)) {
			t.Errorf("IsStoreFault(%v) = false", fault)
		}
	}
	if fencing.IsStoreFault(nil) || fencing.IsStoreFault(errors.New("other")) {
		t.Error("IsStoreFault of nil or an unrelated error is true")
	}
}
