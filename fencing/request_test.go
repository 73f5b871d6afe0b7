package fencing_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// wantInvalid fails unless err is a *ValidationError on field.
func wantInvalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	var v *fencing.ValidationError
	if !errors.Is(err, fencing.ErrInvalid) || !errors.As(err, &v) {
		t.Fatalf("%s: %v, want a *ValidationError matching ErrInvalid", what, err)
	}
	if v.Field != field || v.Reason == "" {
		t.Fatalf("%s: field %q reason %q, want field %q with a reason", what, v.Field, v.Reason, field)
	}
}

var resourceRef = regexp.MustCompile(`^[A-Za-z0-9._:~-]{1,200}$`)

func TestValidateResource(t *testing.T) {
	for _, ok := range []string{"a", "job:42", "A-Z_a.z~0:9", strings.Repeat("r", 200), "..", "~"} {
		if err := fencing.ValidateResource(ok); err != nil {
			t.Errorf("ValidateResource(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("r", 201), "a/b", "a b", "a\x00", "é", "a%20", "a?b", "a#b", "*", "a\tb"} {
		wantInvalid(t, "ValidateResource("+bad+")", fencing.ValidateResource(bad), "resource")
	}
}

func TestValidateResourcePrefix(t *testing.T) {
	if err := fencing.ValidateResourcePrefix(""); err != nil {
		t.Fatalf("empty prefix: %v", err)
	}
	if err := fencing.ValidateResourcePrefix("job:"); err != nil {
		t.Fatalf("job: prefix: %v", err)
	}
	wantInvalid(t, "prefix a/b", fencing.ValidateResourcePrefix("a/b"), "prefix")
}

// FuzzValidateResource checks ValidateResource against a regular
// expression of the contract.
func FuzzValidateResource(f *testing.F) {
	for _, s := range []string{"", "a", "job:1", "a/b", "a b", strings.Repeat("x", 200), strings.Repeat("x", 201), "\xff", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := fencing.ValidateResource(s)
		if want := resourceRef.MatchString(s); want != (err == nil) {
			t.Fatalf("ValidateResource(%q) = %v, reference accepts=%v", s, err, want)
		}
		if err != nil {
			wantInvalid(t, "ValidateResource", err, "resource")
		}
	})
}

// ownerRef is the owner contract written out plainly.
func ownerRef(s string) bool {
	if len(s) < 1 || len(s) > 200 || s[0] == ' ' || s[len(s)-1] == ' ' {
		return false
	}
	for _, c := range []byte(s) {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

func TestValidateOwner(t *testing.T) {
	for _, ok := range []string{"a", "worker 7", "host-1/pid:42", "~!@#$%^&*()", strings.Repeat("o", 200)} {
		if err := fencing.ValidateOwner(ok); err != nil {
			t.Errorf("ValidateOwner(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", " ", " a", "a ", "a\x00", "a\tb", "a\nb", "\x7f", "é", strings.Repeat("o", 201)} {
		wantInvalid(t, "ValidateOwner("+bad+")", fencing.ValidateOwner(bad), "owner")
	}
}

// FuzzValidateOwner checks ValidateOwner against ownerRef.
func FuzzValidateOwner(f *testing.F) {
	for _, s := range []string{"", "a", " a", "a ", "a b", "\x01", "\x7f", "é", strings.Repeat("o", 200), strings.Repeat("o", 201)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := fencing.ValidateOwner(s)
		if want := ownerRef(s); want != (err == nil) {
			t.Fatalf("ValidateOwner(%q) = %v, reference accepts=%v", s, err, want)
		}
		if err != nil {
			wantInvalid(t, "ValidateOwner", err, "owner")
		}
	})
}

func TestValidateTTL(t *testing.T) {
	for _, ok := range []time.Duration{time.Second, 30 * time.Second, time.Hour, 24 * time.Hour} {
		if err := fencing.ValidateTTL(ok); err != nil {
			t.Errorf("ValidateTTL(%v): %v", ok, err)
		}
	}
	for _, bad := range []time.Duration{0, -time.Second, time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond, 24*time.Hour + time.Second, 24*time.Hour + time.Nanosecond} {
		wantInvalid(t, "ValidateTTL("+bad.String()+")", fencing.ValidateTTL(bad), "ttl_seconds")
	}
}

func TestValidateWait(t *testing.T) {
	for _, ok := range []time.Duration{0, time.Millisecond, 60 * time.Second} {
		if err := fencing.ValidateWait(ok); err != nil {
			t.Errorf("ValidateWait(%v): %v", ok, err)
		}
	}
	for _, bad := range []time.Duration{-time.Nanosecond, 60*time.Second + time.Nanosecond} {
		wantInvalid(t, "ValidateWait("+bad.String()+")", fencing.ValidateWait(bad), "wait_seconds")
	}
}

func TestRequestValidate(t *testing.T) {
	const res, owner = "job:1", "alice"
	cases := []struct {
		name  string
		err   error
		field string // "" means valid
	}{
		{"acquire ok", fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Second}.Validate(), ""},
		{"acquire bad resource first", fencing.AcquireRequest{Resource: "", Owner: "", TTL: 0}.Validate(), "resource"},
		{"acquire bad owner", fencing.AcquireRequest{Resource: res, Owner: "", TTL: time.Second}.Validate(), "owner"},
		{"acquire no TTL", fencing.AcquireRequest{Resource: res, Owner: owner}.Validate(), "ttl_seconds"},
		{"renew ok without TTL", fencing.RenewRequest{Resource: res, Owner: owner, Token: 1}.Validate(), ""},
		{"renew bad TTL", fencing.RenewRequest{Resource: res, Owner: owner, Token: 1, TTL: time.Millisecond}.Validate(), "ttl_seconds"},
		{"renew token 0", fencing.RenewRequest{Resource: res, Owner: owner}.Validate(), "token"},
		{"release ok", fencing.ReleaseRequest{Resource: res, Owner: owner, Token: 1, Finished: true}.Validate(), ""},
		{"release token 0", fencing.ReleaseRequest{Resource: res, Owner: owner}.Validate(), "token"},
		{"admit ok", fencing.AdmitRequest{Resource: res, Token: 1<<64 - 1}.Validate(), ""},
		{"admit token 0", fencing.AdmitRequest{Resource: res}.Validate(), "token"},
		{"admit bad resource", fencing.AdmitRequest{Resource: "a b", Token: 1}.Validate(), "resource"},
		{"checkpoint ok", fencing.CheckpointRequest{Resource: res, Owner: owner, Token: 1, State: json.RawMessage(`{"a":1}`)}.Validate(10), ""},
		{"checkpoint at limit", fencing.CheckpointRequest{Resource: res, Owner: owner, Token: 1, State: json.RawMessage(`"12345678"`)}.Validate(10), ""},
		{"checkpoint empty", fencing.CheckpointRequest{Resource: res, Owner: owner, Token: 1}.Validate(10), "state"},
		{"checkpoint not JSON", fencing.CheckpointRequest{Resource: res, Owner: owner, Token: 1, State: json.RawMessage(`{`)}.Validate(10), "state"},
		{"list ok", fencing.ListRequest{Prefix: "job:", Limit: fencing.MaxListLimit}.Validate(), ""},
		{"list negative", fencing.ListRequest{Limit: -1}.Validate(), "limit"},
		{"list over", fencing.ListRequest{Limit: fencing.MaxListLimit + 1}.Validate(), "limit"},
		{"list bad prefix", fencing.ListRequest{Prefix: "a/"}.Validate(), "prefix"},
		{"list after ok", fencing.ListRequest{Prefix: "job:", After: "job:7"}.Validate(), ""},
		{"list bad after", fencing.ListRequest{After: "job 7"}.Validate(), "after"},
	}
	for _, c := range cases {
		if c.field == "" {
			if c.err != nil {
				t.Errorf("%s: %v", c.name, c.err)
			}
			continue
		}
		wantInvalid(t, c.name, c.err, c.field)
	}
	err := fencing.CheckpointRequest{Resource: res, Owner: owner, Token: 1, State: json.RawMessage(`"123456789"`)}.Validate(10)
	var tl *fencing.TooLargeError
	if !errors.Is(err, fencing.ErrTooLarge) || !errors.As(err, &tl) || tl.Size != 11 || tl.Limit != 10 {
		t.Fatalf("checkpoint over the limit: %v, want *TooLargeError{11, 10}", err)
	}
	if got := (fencing.ListRequest{}).EffectiveLimit(); got != fencing.MaxListLimit {
		t.Fatalf("EffectiveLimit of 0 = %d", got)
	}
	if got := (fencing.ListRequest{Limit: 3}).EffectiveLimit(); got != 3 {
		t.Fatalf("EffectiveLimit of 3 = %d", got)
	}
	for _, c := range []struct {
		req  fencing.ListRequest
		name string
		want bool
	}{
		{fencing.ListRequest{}, "a", true},
		{fencing.ListRequest{Prefix: "job:"}, "job:1", true},
		{fencing.ListRequest{Prefix: "job:"}, "jobs", false},
		{fencing.ListRequest{Prefix: "job:", After: "job:1"}, "job:1", false},
		{fencing.ListRequest{Prefix: "job:", After: "job:1"}, "job:10", true},
		{fencing.ListRequest{Prefix: "job:", After: "job:1"}, "job:0", false},
		{fencing.ListRequest{Prefix: "job:", After: "a"}, "job:0", true},
	} {
		if got := c.req.Wants(c.name); got != c.want {
			t.Errorf("%+v.Wants(%q) = %v, want %v", c.req, c.name, got, c.want)
		}
	}
}

func TestCheckpointStateMustBeUTF8(t *testing.T) {
	req := fencing.CheckpointRequest{Resource: "r", Owner: "o", Token: 1}
	for _, state := range []string{"\"\xff\"", "{\"k\":\"\xc3\x28\"}", "[\"\xed\xa0\x80\"]"} {
		req.State = []byte(state)
		if err := req.Validate(1 << 10); !errors.Is(err, fencing.ErrInvalid) {
			t.Errorf("state %q: %v, want ErrInvalid", state, err)
		}
	}
	req.State = []byte(`{"k":"é ✓"}`)
	if err := req.Validate(1 << 10); err != nil {
		t.Errorf("valid UTF-8 state refused: %v", err)
	}
}
