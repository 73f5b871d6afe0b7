// Package apitoken holds the one definition of a lease API token that a
// client can send: the characters an "Authorization: Bearer <token>" header
// carries as they are. config (FENCEGATE_API_TOKEN), leaseapi (WithToken)
// and the fencegate access commands all ask it, so that a token one of them
// accepts is never refused by another. It imports nothing of fencegate.
package apitoken

// IsTokenChar reports whether r may appear in a token: visible ASCII, 0x21
// '!' to 0x7E '~'. A space, a control character (such as the trailing
// newline of a secret file) or a non-ASCII character may not.
func IsTokenChar(r rune) bool {
	return r > ' ' && r <= '~'
}

// Valid reports whether every character of tok is a token character
// (IsTokenChar). Invalid UTF-8 is not valid; the empty string is (it means
// no token: whether one is required is the caller's decision).
func Valid(tok string) bool {
	for _, r := range tok {
		if !IsTokenChar(r) {
			return false
		}
	}
	return true
}
