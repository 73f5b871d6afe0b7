package fencing

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds on requests. Out-of-bounds requests fail with an error matching
// ErrInvalid (or ErrTooLarge for checkpoint state) and change nothing.
const (
	MaxNameBytes = 200              // resource names and owners
	MinTTL       = time.Second      // shortest lease
	MaxTTL       = 24 * time.Hour   // longest lease
	DefaultTTL   = 30 * time.Second // used by the API when ttl_seconds is absent
	MaxWait      = 60 * time.Second // longest wait_seconds for acquire
	// DefaultMaxCheckpointBytes is the default limit on a checkpoint's
	// encoded JSON state.
	DefaultMaxCheckpointBytes = 1 << 20
	// MaxCheckpointBytesCeiling is the largest checkpoint limit a server
	// may be configured with (FENCEGATE_MAX_CHECKPOINT_BYTES): no answer
	// of the lease API carries a larger state.
	MaxCheckpointBytesCeiling = 16 << 20
	// MaxListLimit is the most leases one List call returns.
	MaxListLimit = 1000
)

// ValidateResource checks a resource name: 1 to 200 bytes of
// [A-Za-z0-9._:~-].
func ValidateResource(name string) error {
	if name == "" {
		return invalidf("resource", "must not be empty")
	}
	if len(name) > MaxNameBytes {
		return invalidf("resource", fmt.Sprintf("must be at most %d bytes", MaxNameBytes))
	}
	for i := 0; i < len(name); i++ {
		if !IsResourceByte(name[i]) {
			return invalidf("resource", "may contain only A-Z a-z 0-9 . _ : ~ -")
		}
	}
	return nil
}

// IsResourceByte reports whether c may appear in a resource name.
func IsResourceByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '.', c == '_', c == ':', c == '~', c == '-':
		return true
	}
	return false
}

// ValidateResourcePrefix checks a List prefix: empty, or a valid resource
// name prefix.
func ValidateResourcePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if err := ValidateResource(prefix); err != nil {
		v := err.(*ValidationError)
		return invalidf("prefix", v.Reason)
	}
	return nil
}

// ValidateOwner checks an owner: 1 to 200 bytes of printable ASCII (0x20 to
// 0x7e), not starting or ending with a space.
func ValidateOwner(owner string) error {
	if owner == "" {
		return invalidf("owner", "must not be empty")
	}
	if len(owner) > MaxNameBytes {
		return invalidf("owner", fmt.Sprintf("must be at most %d bytes", MaxNameBytes))
	}
	for i := 0; i < len(owner); i++ {
		if owner[i] < 0x20 || owner[i] > 0x7e {
			return invalidf("owner", "may contain only printable ASCII characters")
		}
	}
	if owner[0] == ' ' || owner[len(owner)-1] == ' ' {
		return invalidf("owner", "must not start or end with a space")
	}
	return nil
}

// ValidateTTL checks a lease duration: whole seconds within [1 s, 24 h].
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL || ttl%time.Second != 0 {
		return invalidf("ttl_seconds", fmt.Sprintf("must be a whole number of seconds between %d and %d", int(MinTTL/time.Second), int(MaxTTL/time.Second)))
	}
	return nil
}

// ValidateWait checks an acquire wait: within [0, 60 s].
func ValidateWait(wait time.Duration) error {
	if wait < 0 || wait > MaxWait {
		return invalidf("wait_seconds", fmt.Sprintf("must be between 0 and %d", int(MaxWait/time.Second)))
	}
	return nil
}

func validateToken(t Token) error {
	if t == 0 {
		return invalidf("token", "must be a positive integer")
	}
	return nil
}

// AcquireRequest asks for a lease on Resource for Owner.
type AcquireRequest struct {
	Resource string
	Owner    string
	TTL      time.Duration // required, see ValidateTTL
}

// Validate checks the request's bounds.
func (r AcquireRequest) Validate() error {
	return firstErr(ValidateResource(r.Resource), ValidateOwner(r.Owner), ValidateTTL(r.TTL))
}

// RenewRequest extends the live lease held by Owner with Token.
type RenewRequest struct {
	Resource string
	Owner    string
	Token    Token
	TTL      time.Duration // zero keeps the lease's current TTL
}

// Validate checks the request's bounds.
func (r RenewRequest) Validate() error {
	err := firstErr(ValidateResource(r.Resource), ValidateOwner(r.Owner), validateToken(r.Token))
	if err == nil && r.TTL != 0 {
		err = ValidateTTL(r.TTL)
	}
	return err
}

// ReleaseRequest ends the lease held by Owner with Token.
type ReleaseRequest struct {
	Resource string
	Owner    string
	Token    Token
	Finished bool // the work is done; the next holder need not resume it
}

// Validate checks the request's bounds.
func (r ReleaseRequest) Validate() error {
	return firstErr(ValidateResource(r.Resource), ValidateOwner(r.Owner), validateToken(r.Token))
}

// CheckpointRequest saves State for the live lease held by Owner with Token,
// and renews the lease by its TTL in the same atomic step.
type CheckpointRequest struct {
	Resource string
	Owner    string
	Token    Token
	State    json.RawMessage // any JSON value; size-limited by the store
}

// Validate checks the request's bounds against the size limit maxBytes.
func (r CheckpointRequest) Validate(maxBytes int) error {
	if err := firstErr(ValidateResource(r.Resource), ValidateOwner(r.Owner), validateToken(r.Token)); err != nil {
		return err
	}
	if len(r.State) > maxBytes {
		return &TooLargeError{Size: len(r.State), Limit: maxBytes}
	}
	if len(r.State) == 0 || !json.Valid(r.State) {
		return invalidf("state", "must be a JSON value")
	}
	// json.Valid accepts invalid UTF-8 inside strings; stored as is, it
	// would be returned as text that is not JSON (RFC 8259 §8.1).
	if !utf8.Valid(r.State) {
		return invalidf("state", "must be JSON encoded in valid UTF-8")
	}
	return nil
}

// AdmitRequest asks whether a write to Resource carrying Token may pass.
type AdmitRequest struct {
	Resource string
	Token    Token
	// RequireLive also requires a live lease holding Token (strict rules).
	RequireLive bool
	// MarkRead says the caller has just read the resource's marks (a
	// MarkReader) and the read did not settle the request: a store whose
	// admission starts with such a read may skip it and admit the full
	// way. A hint only; the answer is the same without it.
	MarkRead bool
}

// Validate checks the request's bounds.
func (r AdmitRequest) Validate() error {
	return firstErr(ValidateResource(r.Resource), validateToken(r.Token))
}

// ListRequest asks for live leases whose resource starts with Prefix, in
// resource order, at most Limit of them (0 means MaxListLimit), and only
// those whose resource sorts after After (byte order) when After is set.
//
// After is a page cursor: the last resource of the previous page. Following
// it page by page lists every lease that stays live for the whole listing
// exactly once (names only grow from page to page); a lease taken or ended
// meanwhile may or may not appear.
type ListRequest struct {
	Prefix string
	Limit  int
	After  string
}

// Validate checks the request's bounds.
func (r ListRequest) Validate() error {
	if err := ValidateResourcePrefix(r.Prefix); err != nil {
		return err
	}
	if r.Limit < 0 || r.Limit > MaxListLimit {
		return invalidf("limit", fmt.Sprintf("must be between 1 and %d", MaxListLimit))
	}
	if r.After != "" {
		if err := ValidateResource(r.After); err != nil {
			return invalidf("after", err.(*ValidationError).Reason)
		}
	}
	return nil
}

// Wants reports whether a resource name belongs in the answer to r: it
// starts with Prefix and sorts after After.
func (r ListRequest) Wants(resource string) bool {
	return strings.HasPrefix(resource, r.Prefix) && resource > r.After
}

// EffectiveLimit is Limit, or MaxListLimit when Limit is zero.
func (r ListRequest) EffectiveLimit() int {
	if r.Limit == 0 {
		return MaxListLimit
	}
	return r.Limit
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
