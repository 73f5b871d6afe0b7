package fencing

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Stores and callers wrap them with context; check them with
// errors.Is. The typed errors below carry the extra facts a caller needs to
// answer (who holds the lease, what the high-water mark is) and match their
// sentinel through errors.Is.
var (
	// ErrInvalid: the request is out of bounds (bad resource name, owner,
	// TTL, token). Nothing was changed.
	ErrInvalid = errors.New("invalid argument")
	// ErrTooLarge: a checkpoint state exceeds the store's size limit.
	// Nothing was changed.
	ErrTooLarge = errors.New("payload too large")
	// ErrLeaseHeld: another owner holds a live lease on the resource.
	ErrLeaseHeld = errors.New("lease held by another owner")
	// ErrLeaseLost: the caller is not the current live holder (wrong owner,
	// wrong token, or the lease expired or was released).
	ErrLeaseLost = errors.New("lease lost")
	// ErrStaleToken: a write's token is below the resource's high-water mark.
	ErrStaleToken = errors.New("stale token")
	// ErrTokenNotIssued: a write's token is above every token issued for the
	// resource; it was never handed out.
	ErrTokenNotIssued = errors.New("token not issued")
	// ErrLeaseNotHeld: a strict admission found no live lease with the token.
	ErrLeaseNotHeld = errors.New("lease not held")
	// ErrNoCheckpoint: the resource has no checkpoint.
	ErrNoCheckpoint = errors.New("no checkpoint")
	// ErrUnavailable: the store could not be reached; the operation was not
	// performed. Callers fail closed.
	ErrUnavailable = errors.New("store unavailable")
	// ErrAmbiguous: the request reached the store but no answer came back
	// (timeout or broken connection after sending); it may or may not have
	// taken effect. Callers fail closed and must not assume either outcome.
	ErrAmbiguous = errors.New("store outcome ambiguous")
	// ErrStoreLost: the store detected that it lost data for the resource
	// (for example a Valkey failover to a lagging replica, or a FLUSHALL
	// noticed by a gate that saw the resource before it). The operation was
	// not performed. Before answering it, the store has moved the resource
	// past every token it knows was issued before the loss, so a retry with a
	// pre-loss token is refused as stale (StaleTokenError.BeforeLoss) and the
	// next acquisition gets a token above every pre-loss token. A store that
	// can only detect a loss when it opens (the file store) recovers there
	// and never returns it.
	//
	// Every store must keep DESIGN's promise across a loss it can detect:
	// never repeat a token, never admit a token superseded before the loss
	// after a post-loss write. It either returns ErrStoreLost until it has
	// recovered, or recovers at once by moving every affected resource past
	// a floor above all pre-loss tokens.
	ErrStoreLost = errors.New("store data loss detected")
)

// IsStoreFault reports whether err means the store could not give a definite
// answer (unavailable, ambiguous, or data loss detected). Such an outcome must
// never be treated as an admission.
func IsStoreFault(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrAmbiguous) || errors.Is(err, ErrStoreLost)
}

// ValidationError says which field of a request is out of bounds and why.
// It matches ErrInvalid.
type ValidationError struct {
	Field  string // the request field, as named in the API ("resource", "ttl_seconds")
	Reason string // what the field accepts
}

func (e *ValidationError) Error() string { return e.Field + " " + e.Reason }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

func invalidf(field, reason string) error { return &ValidationError{Field: field, Reason: reason} }

// TooLargeError reports a checkpoint state above the limit. It matches
// ErrTooLarge.
type TooLargeError struct {
	Size, Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("checkpoint state is %d bytes, the limit is %d", e.Size, e.Limit)
}

// Is makes errors.Is(err, ErrTooLarge) true.
func (e *TooLargeError) Is(target error) bool { return target == ErrTooLarge }

// LeaseHeldError reports the live holder of a resource. It matches
// ErrLeaseHeld.
type LeaseHeldError struct {
	Resource  string
	Holder    string
	ExpiresAt time.Time // by the store's clock
	// Now is the store's clock when it answered (zero when unknown).
	// Remaining uses it, so that how long the lease has left never mixes
	// the store's clock (the Valkey server's TIME) with the caller's.
	Now time.Time
}

// Remaining is how long the lease had left when the store answered:
// ExpiresAt - Now by the store's own clock, or, when the store did not say
// what its clock read, until ExpiresAt by the caller's clock.
func (e *LeaseHeldError) Remaining() time.Duration {
	if e.Now.IsZero() {
		return time.Until(e.ExpiresAt)
	}
	return e.ExpiresAt.Sub(e.Now)
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("lease on %q held by %q until %s", e.Resource, e.Holder, e.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrLeaseHeld) true.
func (e *LeaseHeldError) Is(target error) bool { return target == ErrLeaseHeld }

// StaleTokenError reports a token below the high-water mark, or one issued
// before the store lost its data. It matches ErrStaleToken.
type StaleTokenError struct {
	Resource string
	Token    Token
	// HighWater is the lowest token the store would admit now: the
	// high-water mark, or, when BeforeLoss, the store's floor plus one.
	HighWater Token
	// BeforeLoss: the token is at or below the floor a store set after it
	// detected a loss of its data (or a floor set when its data began): it
	// was issued before that and no admitted write superseded it. No write
	// with a newer token need have been admitted.
	BeforeLoss bool
}

func (e *StaleTokenError) Error() string {
	if e.BeforeLoss {
		return fmt.Sprintf("token %d for %q predates the store's current data (tokens from %d on are admitted)", e.Token, e.Resource, e.HighWater)
	}
	return fmt.Sprintf("token %d for %q is older than the newest admitted token %d", e.Token, e.Resource, e.HighWater)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// TokenNotIssuedError reports a token above the newest issued token. It
// matches ErrTokenNotIssued.
type TokenNotIssuedError struct {
	Resource string
	Token    Token
	Issued   Token
}

func (e *TokenNotIssuedError) Error() string {
	return fmt.Sprintf("token %d for %q was never issued (newest issued token is %d)", e.Token, e.Resource, e.Issued)
}

// Is makes errors.Is(err, ErrTokenNotIssued) true.
func (e *TokenNotIssuedError) Is(target error) bool { return target == ErrTokenNotIssued }
