package valkeystore

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/redcon"

	"github.com/fencegate/fencegate/fencing"
)

// wellFormedReplies are replies frameReply takes whole, within 64 bytes.
var wellFormedReplies = []string{
	"+OK\r\n", "+\r\n", "-ERR unknown\r\n", ":-12\r\n", ":0\r\n",
	"$-1\r\n", "$0\r\n\r\n", "$3\r\na\rb\r\n", "$+3\r\nabc\r\n", "$003\r\nabc\r\n",
	"*-1\r\n", "*0\r\n",
	"*3\r\n$1\r\n9\r\n$-1\r\n:7\r\n",
	"*2\r\n*0\r\n*1\r\n-ERR x\r\n",
	"*1\r\n*1\r\n*1\r\n*1\r\n+x\r\n", // maxMarkReplyDepth
}

// malformedReplies are replies no bytes can make one a mark reader takes,
// within any limit of 64 bytes or more.
var malformedReplies = []string{
	// Lengths redcon's bounds check overflows on (it panics).
	"$9223372036854775807\r\n",
	"$9223372036854775790\r\n",
	"*3\r\n$9223372036854775790\r\nab",
	"*1\r\n$9223372036854775807\r\n",
	"*9223372036854775807\r\n",
	// Lengths redcon takes as nil, or refuses.
	"$-2\r\n", "*-5\r\n", "*1\r\n$-9\r\n", "$x\r\n", "$\r\n", "*1x\r\n", "$99999999999999999999\r\n",
	// Integers redcon refuses.
	":1a\r\n", ":-\r\n", ":\r\n", ":+5\r\n",
	// RESP3 types (the reader speaks RESP2).
	"%1\r\n+a\r\n+b\r\n", ">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n", "_\r\n", "#t\r\n", ",1.5\r\n", "|1\r\n", "*1\r\n_\r\n",
	// Lines and bulk strings not ended by CRLF.
	"+OK\n", "*1\r\n+OK\n", "$1\r\nabc\r\n", "$1\r\na\n\r\n",
	// Arrays nested deeper than maxMarkReplyDepth.
	"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n+x\r\n",
}

// overLimitReplies are replies that cannot end within 64 bytes.
var overLimitReplies = []string{
	"$65\r\n", "$60\r\n", "*30\r\n", "*2\r\n$52\r\n",
	"+" + strings.Repeat("a", 63), "*1\r\n-" + strings.Repeat("a", 59),
}

// TestFrameReply: a well-formed reply is framed to its length, whatever
// follows it, and every part of it is "more to come"; a malformed one is
// refused as a protocol error (unavailable) once its offending bytes are
// in, and none of its parts is taken as a reply.
func TestFrameReply(t *testing.T) {
	const limit = 64
	for _, r := range wellFormedReplies {
		for _, tail := range []string{"", "+NEXT\r\n", "$9223372036854775807\r\n"} {
			if n, err := frameReply([]byte(r+tail), limit); n != len(r) || err != nil {
				t.Errorf("frameReply(%q): %d, %v; want %d", r+tail, n, err, len(r))
			}
		}
		for cut := range len(r) {
			if n, err := frameReply([]byte(r[:cut]), limit); n != 0 || err != nil {
				t.Errorf("frameReply(%q), a part of %q: %d, %v; want more to come", r[:cut], r, n, err)
			}
		}
	}
	for _, r := range slices.Concat(malformedReplies, overLimitReplies) {
		n, err := frameReply([]byte(r), limit)
		if n != 0 || !errors.Is(err, fencing.ErrUnavailable) {
			t.Errorf("frameReply(%q): %d, %v; want a protocol error", r, n, err)
		}
		for cut := range len(r) {
			if n, _ := frameReply([]byte(r[:cut]), limit); n != 0 {
				t.Errorf("frameReply(%q), a part of %q: took %d bytes as a reply", r[:cut], r, n)
			}
		}
	}
	// At the store's own limit: a reply of exactly maxMarkReplyBytes is
	// framed, one byte more cannot end.
	body := maxMarkReplyBytes - len("$1048565\r\n\r\n")
	whole := "$" + strconv.Itoa(body) + "\r\n" + strings.Repeat("a", body) + "\r\n"
	if n, err := frameReply([]byte(whole), maxMarkReplyBytes); n != maxMarkReplyBytes || err != nil {
		t.Fatalf("a reply of maxMarkReplyBytes: %d, %v", n, err)
	}
	if _, err := frameReply([]byte("$"+strconv.Itoa(body+1)+"\r\n"), maxMarkReplyBytes); err == nil {
		t.Fatal("a reply one byte beyond maxMarkReplyBytes was not refused")
	}
}

// TestMarkRepliesRefuseMalformed: a malformed reply to a batch's read,
// whole or a byte at a time, fails the batch (so the gate gives it to the
// worker at once) and settles nothing; it neither panics nor waits for
// bytes that cannot make it a reply.
func TestMarkRepliesRefuseMalformed(t *testing.T) {
	s := &Store{prefix: "p", seen: newSeenMarks(), slack: time.Hour}
	reqs := []fencing.AdmitRequest{{Resource: "a", Token: 7}, {Resource: "b", Token: 7}}
	first := "*3\r\n$1\r\n9\r\n$1\r\n7\r\n$1\r\n2\r\n" // a well-formed reply to the first read
	replies := append([]string{"$1048576\r\n", "*400000\r\n", "+" + strings.Repeat("a", maxMarkReplyBytes)}, malformedReplies...)
	for _, r := range replies {
		for _, step := range []int{len(first) + len(r), 16 << 10, 1} {
			if step == 1 && len(r) > 1024 {
				continue // frameReply reads a reply from its start at each add
			}
			m := markReplies{s: s}
			m.start(nil, reqs)
			wire := first + r
			var err error
			for i := 0; i < len(wire) && err == nil; i += step {
				var done bool
				done, err = m.add([]byte(wire[i:min(i+step, len(wire))]))
				if done {
					t.Fatalf("reply %q (%d bytes at a time): the batch was answered", r, step)
				}
			}
			if !errors.Is(err, fencing.ErrUnavailable) {
				t.Fatalf("reply %q (%d bytes at a time): %v; want a protocol error", r, step, err)
			}
			if m.ok[1] {
				t.Fatalf("reply %q: settled", r)
			}
		}
	}
}

// FuzzFrameReply holds frameReply to redcon: where it frames a reply,
// redcon reads the same length (without panicking); where it wants more,
// redcon finds no reply either; and every reply redcon reads within the
// bounds (limit bytes, no length below -1, arrays nested at most
// maxMarkReplyDepth deep) is framed, to the same length, whatever the cut.
func FuzzFrameReply(f *testing.F) {
	for _, r := range slices.Concat(wellFormedReplies, malformedReplies, overLimitReplies) {
		f.Add([]byte(r), uint16(64), uint16(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, limit16, cut16 uint16) {
		limit := int(limit16%1024) + 1
		n, err := frameReply(b, limit)
		if n < 0 || n > len(b) || n > limit || n > 0 && err != nil {
			t.Fatalf("frameReply: %d, %v of %d bytes (limit %d)", n, err, len(b), limit)
		}
		k, r, panicked := redconRead(b)
		switch {
		case n > 0 && (panicked || k != n):
			t.Fatalf("frameReply framed %d bytes; redcon read %d (panicked: %v)", n, k, panicked)
		case n == 0 && err == nil && (panicked || k != 0):
			t.Fatalf("frameReply wants more; redcon read %d (panicked: %v)", k, panicked)
		case k > 0 && !panicked && k <= limit && withinBounds(r, 0) && n != k:
			t.Fatalf("redcon read %d bytes within bounds; frameReply: %d, %v", k, n, err)
		}
		if n > 0 {
			c := int(cut16) % n
			if m, err := frameReply(b[:c], limit); m != 0 || err != nil {
				t.Fatalf("cut at %d of a reply of %d: %d, %v", c, n, m, err)
			}
		}
	})
}

// redconRead is redcon.ReadNextRESP, reporting a panic.
func redconRead(b []byte) (n int, r redcon.RESP, panicked bool) {
	defer func() {
		if recover() != nil {
			n, r, panicked = 0, redcon.RESP{}, true
		}
	}()
	n, r = redcon.ReadNextRESP(b)
	return n, r, false
}

// withinBounds reports whether reply r, read by redcon at the given
// depth, declares no length below -1 and nests arrays at most
// maxMarkReplyDepth deep.
func withinBounds(r redcon.RESP, depth int) bool {
	switch r.Type {
	case redcon.Bulk:
		if r.Data == nil { // nil: redcon takes any negative length as one
			n, err := strconv.Atoi(string(r.Raw[1 : len(r.Raw)-2]))
			return err == nil && n == -1
		}
	case redcon.Array:
		if r.Count < -1 || r.Count > 0 && depth == maxMarkReplyDepth {
			return false
		}
		ok := true
		r.ForEach(func(e redcon.RESP) bool {
			ok = withinBounds(e, depth+1)
			return ok
		})
		return ok
	}
	return true
}
