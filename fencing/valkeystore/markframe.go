package valkeystore

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/fencegate/fencegate/fencing"
)

// A mark reader frames each reply itself (frameReply) before redcon parses
// it: redcon.ReadNextRESP trusts a declared length (a bulk string of
// 9223372036854775807 bytes overflows its bounds check and panics), takes a
// negative one as nil, and answers "not yet" to bytes no more bytes can
// make a reply, which would hold the reader until it is overdue. A frame
// is judged as far as its bytes go: a type byte, a line or a length that
// is not RESP2, or a reply that cannot end within maxMarkReplyBytes, fails
// the reader at once, as the protocol error it is.

// maxMarkReplyDepth bounds how deep a reply's arrays nest (HMGET's reply is
// one array of bulk strings), and so redcon's recursion over them.
const maxMarkReplyDepth = 4

// minRESPElement is the size of the smallest RESP2 element ("+\r\n"): what
// each element an array still owes needs at least.
const minRESPElement = 3

// frameReply returns the length of the RESP2 reply b begins with, as
// redcon.ReadNextRESP reads it: n > 0 when the reply is whole, 0 (and no
// error) while more bytes may complete it. It returns an error wrapping
// fencing.ErrUnavailable when no bytes can: a type byte other than
// + - : $ *, a line ending in a bare LF, an integer or a length redcon
// refuses, a bulk string not followed by CRLF, a length below -1 (nil),
// arrays nested deeper than maxMarkReplyDepth, or a reply that cannot end
// within limit bytes. Every reply redcon reads within those bounds is
// framed to the same length (FuzzFrameReply); frameReply itself never
// reads past b and allocates only its error.
func frameReply(b []byte, limit int) (int, error) {
	var due [maxMarkReplyDepth + 1]int // elements still due at each depth
	due[0] = 1
	d, owed, pos := 0, 1, 0 // open arrays, elements due in all, bytes framed
	for {
		if pos == len(b) {
			return 0, incomplete(b, limit)
		}
		kind := b[pos]
		switch kind {
		case redcon.Integer, redcon.String, redcon.Bulk, redcon.Array, redcon.Error:
		default:
			return 0, frameError(pos, "type byte %q", kind)
		}
		lf := bytes.IndexByte(b[pos+1:], '\n')
		if lf < 0 {
			return 0, incomplete(b, limit)
		}
		lf += pos + 1
		if b[lf-1] != '\r' {
			return 0, frameError(pos, "a line ending in a bare LF")
		}
		line, next := b[pos+1:lf-1], lf+1
		owed--
		due[d]--
		body := false // a bulk string's bytes and CRLF follow the line
		switch kind {
		case redcon.Integer:
			if !isRESPInteger(line) {
				return 0, frameError(pos, "an integer %q", clip(line))
			}
		case redcon.Bulk, redcon.Array:
			n, err := strconv.Atoi(string(line)) // as redcon reads it
			switch {
			case err != nil:
				return 0, frameError(pos, "a length %q", clip(line))
			case n < -1:
				return 0, frameError(pos, "a length of %d", n)
			case n > limit:
				return 0, frameError(pos, "a length of %d, beyond %d bytes", n, limit)
			case kind == redcon.Bulk && n >= 0:
				body, next = true, next+n+2
			case kind == redcon.Array && n > 0:
				if d == maxMarkReplyDepth {
					return 0, frameError(pos, "arrays nested deeper than %d", maxMarkReplyDepth)
				}
				owed += n
				d++
				due[d] = n
			}
		}
		if next+minRESPElement*owed > limit {
			return 0, frameError(pos, "a reply that cannot end within %d bytes", limit)
		}
		if body {
			if len(b) < next {
				return 0, incomplete(b, limit)
			}
			if b[next-2] != '\r' || b[next-1] != '\n' {
				return 0, frameError(pos, "a bulk string not followed by CRLF")
			}
		}
		pos = next
		for d > 0 && due[d] == 0 {
			d--
		}
		if d == 0 && due[0] == 0 {
			return pos, nil
		}
	}
}

// incomplete is frameReply's answer for a reply whose bytes so far, all of
// b, end before it does: more may complete it, unless it already fills
// limit.
func incomplete(b []byte, limit int) error {
	if len(b) >= limit {
		return fmt.Errorf("%w: mark reader: no reply within %d bytes", fencing.ErrUnavailable, limit)
	}
	return nil
}

// frameError is a protocol error at byte pos of a reply.
func frameError(pos int, format string, args ...any) error {
	return fmt.Errorf("%w: mark reader: not a RESP2 reply: at byte %d, %s", fencing.ErrUnavailable, pos, fmt.Sprintf(format, args...))
}

// isRESPInteger reports whether line is an integer as redcon takes one:
// digits, after an optional '-'.
func isRESPInteger(line []byte) bool {
	if len(line) > 0 && line[0] == '-' {
		line = line[1:]
	}
	if len(line) == 0 {
		return false
	}
	for _, c := range line {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// clip shortens a line quoted in an error.
func clip(line []byte) []byte {
	return line[:min(len(line), 32)]
}

// readReply parses the reply b begins with: n > 0 and the reply when it is
// whole (redcon parses only what frameReply framed), 0 while more bytes
// may complete it, or frameReply's protocol error.
func readReply(b []byte) (n int, r redcon.RESP, err error) {
	if n, err = frameReply(b, maxMarkReplyBytes); n == 0 || err != nil {
		return 0, redcon.RESP{}, err
	}
	// A second layer, should frameReply and redcon ever disagree (the
	// fuzz target holds them together): redcon's panic or a different
	// length is the same protocol error, never a panic on the event loop
	// or, in introduce, on a goroutine whose panic ends the process.
	defer func() {
		if p := recover(); p != nil {
			n, r, err = 0, redcon.RESP{}, fmt.Errorf("%w: mark reader: a reply redcon could not parse: %v", fencing.ErrUnavailable, p)
		}
	}()
	if k, r := redcon.ReadNextRESP(b[:n]); k == n {
		return n, r, nil
	}
	return 0, redcon.RESP{}, fmt.Errorf("%w: mark reader: a reply redcon could not parse", fencing.ErrUnavailable)
}
