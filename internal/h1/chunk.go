package h1

import "errors"

// ErrChunked reports a chunked body whose framing is broken, too large to
// count, or outside what net/http would read the same way.
var ErrChunked = errors.New("h1: malformed chunked body")

// Limits of a chunked body, those net/http applies (net/http/internal's
// chunkedReader and body.readTrailer), so that the scanner never finds an
// end where net/http finds an error.
const (
	// maxChunkLine bounds a chunk-size line, its extensions included,
	// CRLF excluded (net/http: under 4096 bytes, in a 4096-byte buffer).
	maxChunkLine = 4000
	// maxChunkDigits is the most hex digits of a size net/http reads,
	// leading zeros included.
	maxChunkDigits = 16
	// maxChunkExcess is net/http's bound on framing bytes beyond 16 per
	// chunk and twice its data.
	maxChunkExcess = 16 << 10
	// maxTrailer bounds the trailer section (net/http: its final CRLF
	// within one 4096-byte buffer).
	maxTrailer = 4000
)

// ChunkScanner follows a chunked body's framing (RFC 9112 §7.1) as it is
// relayed byte for byte, to find where it ends. The zero value is at the
// start of a body.
type ChunkScanner struct {
	state   uint8
	digits  uint8
	size    int64 // the current chunk's size, then its data still due
	line    int   // bytes of the current size line or of the trailer section
	excess  int64 // net/http's framing-overhead count
	started bool
}

const (
	chunkSize        = iota // at the start of a size line
	chunkSizeDigits         // inside the size, after one digit
	chunkSizeWS             // after the size, in trailing blanks
	chunkExt                // inside the extensions (';' and on)
	chunkSizeLF             // after the size line's CR
	chunkData               // inside a chunk's data
	chunkDataCR             // after a chunk's data
	chunkDataLF             // after the CR that ends a chunk's data
	chunkTrailer            // at the start of a trailer line (or the final CRLF)
	chunkTrailerName        // inside a trailer field's name
	chunkTrailerVal         // inside a trailer field's value
	chunkTrailerLF          // after a trailer line's CR
	chunkFinalLF            // after the final CR
	chunkDone               // the body ended
	chunkBroken             // the framing broke: every later call fails
)

// Scan consumes p, the next bytes of the body's stream; it returns how
// many belong to the body (all of p unless the body ends inside it) and
// whether the body ended. After an error the scanner stays failed. A size
// of 2^63 or more (which cannot be counted in an int64), of more than 16
// digits, or a line, trailer or framing overhead beyond net/http's bounds
// is an error.
func (s *ChunkScanner) Scan(p []byte) (n int, done bool, err error) {
	if s.state == chunkDone {
		return 0, true, nil
	}
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch s.state {
		case chunkSize, chunkSizeDigits:
			switch {
			case isHex(b):
				// One more digit would overflow int64 (its largest
				// value is 1<<63-1); net/http reads 16 digits at
				// most, leading zeros included.
				if s.size >= 1<<59 || s.digits >= maxChunkDigits {
					return s.fail()
				}
				s.size = s.size<<4 | int64(unhex(b))
				s.digits++
				s.state = chunkSizeDigits
			case s.state == chunkSize:
				return s.fail()
			case b == ';':
				s.state = chunkExt
			case b == ' ' || b == '\t':
				s.state = chunkSizeWS // net/http trims blanks at the end only: "5 ;x" is refused
			case b == '\r':
				s.state = chunkSizeLF
				continue
			default:
				return s.fail()
			}
			s.line++
		case chunkSizeWS:
			switch b {
			case ' ', '\t':
			case '\r':
				s.state = chunkSizeLF
				continue
			default:
				return s.fail()
			}
			s.line++
		case chunkExt:
			switch b {
			case '\r':
				s.state = chunkSizeLF
				continue
			case '\n':
				return s.fail()
			}
			s.line++
		case chunkSizeLF:
			if b != '\n' || s.line > maxChunkLine {
				return s.fail()
			}
			// net/http counts the size line and the CRLF after the
			// data, and forgives 16 bytes and twice the data per chunk.
			s.excess += int64(s.line) + 2 - 16 - 2*s.size
			s.excess = max(s.excess, 0)
			if s.excess > maxChunkExcess {
				return s.fail()
			}
			s.line, s.digits = 0, 0
			if s.size == 0 {
				s.state = chunkTrailer
			} else {
				s.state = chunkData
			}
		case chunkData:
			m := min(int64(len(p)-i), s.size)
			s.size -= m
			i += int(m) - 1
			if s.size == 0 {
				s.state = chunkDataCR
			}
		case chunkDataCR:
			if b != '\r' {
				return s.fail()
			}
			s.state = chunkDataLF
		case chunkDataLF:
			if b != '\n' {
				return s.fail()
			}
			s.state = chunkSize
		case chunkTrailer:
			switch {
			case b == '\r':
				s.state = chunkFinalLF
			case isTokenByte(b):
				s.state = chunkTrailerName
			default: // an empty name, obs-fold, a bare LF
				return s.fail()
			}
			if s.line++; s.line > maxTrailer {
				return s.fail()
			}
		case chunkTrailerName:
			switch {
			case b == ':':
				s.state = chunkTrailerVal
			case !isTokenByte(b):
				return s.fail()
			}
			if s.line++; s.line > maxTrailer {
				return s.fail()
			}
		case chunkTrailerVal:
			switch {
			case b == '\r':
				s.state = chunkTrailerLF
			case !isValueByte(b):
				return s.fail()
			}
			if s.line++; s.line > maxTrailer {
				return s.fail()
			}
		case chunkTrailerLF:
			if b != '\n' {
				return s.fail()
			}
			s.state = chunkTrailer
		case chunkFinalLF:
			if b != '\n' {
				return s.fail()
			}
			s.state = chunkDone
			return i + 1, true, nil
		case chunkBroken:
			return 0, false, ErrChunked
		}
	}
	return len(p), false, nil
}

func (s *ChunkScanner) fail() (int, bool, error) {
	s.state = chunkBroken
	return 0, false, ErrChunked
}

func isHex(b byte) bool {
	return '0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
}

func unhex(b byte) byte {
	switch {
	case b <= '9':
		return b - '0'
	case b <= 'F':
		return b - 'A' + 10
	}
	return b - 'a' + 10
}

// AppendChunkHeader appends the size line of a chunk of n bytes (n > 0).
func AppendChunkHeader(dst []byte, n int) []byte {
	const digits = "0123456789abcdef"
	var buf [16]byte
	i := len(buf)
	for {
		i--
		buf[i] = digits[n&15]
		n >>= 4
		if n == 0 {
			break
		}
	}
	return append(append(dst, buf[i:]...), "\r\n"...)
}

// LastChunk is the end of a chunked body without trailers.
const LastChunk = "0\r\n\r\n"
