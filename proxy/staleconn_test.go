package proxy

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestReplayableBodyGoesAgainOnlyUnread: a streamed body goes again on
// another attempt only while the last attempt never read from it; the
// attempt given up reads nothing more, so a transport's goroutine late to
// find its connection closed cannot take bytes from under the next one.
func TestReplayableBodyGoesAgainOnlyUnread(t *testing.T) {
	rb := newReplayableBody(strings.NewReader("payload"))
	first := rb.first()
	second, err := rb.again()
	if err != nil {
		t.Fatalf("again after an unread attempt: %v", err)
	}
	if n, err := first.Read(make([]byte, 8)); n != 0 || !errors.Is(err, errAttemptOver) {
		t.Fatalf("the given-up attempt read %d bytes (%v), want none and errAttemptOver", n, err)
	}
	b, err := io.ReadAll(second)
	if err != nil || string(b) != "payload" {
		t.Fatalf("the next attempt read %q (%v), want the whole body", b, err)
	}
	if _, err := rb.again(); err == nil {
		t.Fatal("again after an attempt read from the body: no error")
	}
}
