package fencing_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/fencegate/fencegate/fencing"
)

func TestParseToken(t *testing.T) {
	valid := map[string]fencing.Token{
		"1":                    1,
		"9":                    9,
		"10":                   10,
		"42":                   42,
		"9007199254740993":     1<<53 + 1, // beyond a double's exact range
		"18446744073709551615": 1<<64 - 1,
	}
	for s, want := range valid {
		got, err := fencing.ParseToken(s)
		if err != nil || got != want {
			t.Errorf("ParseToken(%q) = %d, %v; want %d", s, got, err, want)
		}
		if got.String() != s {
			t.Errorf("Token(%d).String() = %q, want %q", got, got.String(), s)
		}
	}
	invalid := []string{
		"", "0", "00", "01", "007", "-1", "+1", " 1", "1 ", "1\n", "1.0", "1e3", "0x10", "١",
		"18446744073709551616",  // 2^64
		"99999999999999999999",  // 20 digits, out of range
		"100000000000000000000", // 21 digits
		"１", "1_000", "abc",
	}
	for _, s := range invalid {
		got, err := fencing.ParseToken(s)
		if err == nil {
			t.Errorf("ParseToken(%q) = %d, want an error", s, got)
			continue
		}
		if !errors.Is(err, fencing.ErrInvalid) {
			t.Errorf("ParseToken(%q): %v does not match ErrInvalid", s, err)
		}
		var v *fencing.ValidationError
		if !errors.As(err, &v) || v.Field != "token" {
			t.Errorf("ParseToken(%q): %v is not a ValidationError on token", s, err)
		}
	}
}

// FuzzParseToken checks ParseToken against a reference: it accepts exactly
// the canonical decimal forms of 1..2^64-1, and round-trips through String.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"1", "42", "0", "01", "-1", "+1", " 1", "18446744073709551615", "18446744073709551616", "", "1e3", "\x00", "9007199254740993"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fencing.ParseToken(s)
		v, refErr := strconv.ParseUint(s, 10, 64)
		canonical := refErr == nil && v > 0 && strconv.FormatUint(v, 10) == s
		if canonical != (err == nil) {
			t.Fatalf("ParseToken(%q) = %d, %v; reference says canonical=%v", s, tok, err, canonical)
		}
		if err != nil {
			if !errors.Is(err, fencing.ErrInvalid) {
				t.Fatalf("ParseToken(%q): %v does not match ErrInvalid", s, err)
			}
			if tok != 0 {
				t.Fatalf("ParseToken(%q) returned %d with an error", s, tok)
			}
			return
		}
		if uint64(tok) != v || tok.String() != s {
			t.Fatalf("ParseToken(%q) = %d (String %q)", s, tok, tok.String())
		}
	})
}
