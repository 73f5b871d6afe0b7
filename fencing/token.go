package fencing

import (
	"fmt"
	"strconv"
)

// Token is a fencing token: a positive integer, issued per resource in
// strictly increasing order. The zero Token is never issued.
type Token uint64

// String renders the token in decimal, the form used in headers and logs.
func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

// ParseToken parses the decimal form of a token as sent in the Fencing-Token
// header: 1 to 20 ASCII digits, no sign, no spaces, no leading zeros, and a
// value in [1, 2^64-1]. Anything else is an error wrapping ErrInvalid.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return 0, invalidf("token", "must not be empty")
	}
	if len(s) > 20 {
		return 0, invalidf("token", "must be at most 20 decimal digits")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, invalidf("token", "must be a positive decimal integer")
		}
	}
	if s[0] == '0' {
		return 0, invalidf("token", "must be a positive decimal integer without leading zeros")
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, invalidf("token", fmt.Sprintf("out of range: must be at most %d", uint64(1<<64-1)))
	}
	return Token(v), nil
}
