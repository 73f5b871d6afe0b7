package apitoken

import "testing"

func TestValid(t *testing.T) {
	for _, tok := range []string{"", "s3cret", "!~", "tok-a_b.c~d+e/f=", "AbC012345678901234567890123456789_-xyz"} {
		if !Valid(tok) {
			t.Errorf("Valid(%q) = false, want true", tok)
		}
	}
	for _, tok := range []string{"tok\n", "two words", " lead", "tab\there", "nul\x00", "del\x7f", "caf\u00e9", "bad\xffutf8", "\r"} {
		if Valid(tok) {
			t.Errorf("Valid(%q) = true, want false", tok)
		}
	}
}

func TestIsTokenCharBounds(t *testing.T) {
	for r := rune(0); r < 0x100; r++ {
		want := r >= 0x21 && r <= 0x7e
		if got := IsTokenChar(r); got != want {
			t.Errorf("IsTokenChar(%#x) = %v, want %v", r, got, want)
		}
	}
	if IsTokenChar(0xfffd) {
		t.Error("IsTokenChar(U+FFFD, invalid UTF-8) = true")
	}
}
