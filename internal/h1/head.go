package h1

import (
	"bytes"
	"errors"
	"strings"
)

// Errors of the head parsers. A caller that may hand a head to a general
// parser does so on any of them.
var (
	ErrHead        = errors.New("h1: malformed head")
	ErrFraming     = errors.New("h1: conflicting or malformed message framing")
	ErrHost        = errors.New("h1: missing, repeated or malformed Host")
	ErrUnsupported = errors.New("h1: outside the subset this parser reads")
)

// Framing values of ContentLength besides a length.
const (
	Chunked    = -1 // Transfer-Encoding: chunked
	UntilClose = -2 // a response body delimited by the connection's close
)

// maxContentDigits bounds a Content-Length's digits: 18 always fit in an
// int64.
const maxContentDigits = 18

// Field is one header field as sent: its name, and its value without the
// blanks around it. Both alias the head.
type Field struct {
	Name, Value []byte
}

// Request is a parsed request head.
type Request struct {
	Method []byte
	Target []byte // origin-form: starts with '/'
	Host   []byte // the one Host field's value
	Fields []Field
	// ContentLength is the body's length (0 without a Content-Length), or
	// Chunked.
	ContentLength int64
	Close         bool // Connection: close
}

// Response is a parsed response head.
type Response struct {
	Minor  int // HTTP/1.Minor: 0 or 1
	Status int
	Reason []byte
	Fields []Field
	// ContentLength is the body's length, Chunked, or UntilClose when the
	// head gives no framing (a status or request method that allows no
	// body has none, whatever this says: the caller knows which).
	ContentLength int64
	// Close: the connection ends after this response (Connection: close,
	// or HTTP/1.0 without keep-alive).
	Close bool
}

// HeadEnd returns the length of the head at the start of b, its final
// CRLFCRLF included, or -1 when b holds no complete head.
func HeadEnd(b []byte) int {
	if i := bytes.Index(b, crlfcrlf); i >= 0 {
		return i + 4
	}
	return -1
}

var crlfcrlf = []byte("\r\n\r\n")

// BareLineEnd reports whether b has a CR not followed by LF, an LF not
// preceded by CR, or a NUL: bytes no parser here accepts in a head. A CR at
// the very end of b is not judged (its LF may come).
func BareLineEnd(b []byte) bool {
	for i, ch := range b {
		switch ch {
		case '\r':
			if i+1 < len(b) && b[i+1] != '\n' {
				return true
			}
		case '\n':
			if i == 0 || b[i-1] != '\r' {
				return true
			}
		case 0:
			return true
		}
	}
	return false
}

// ParseRequest parses head, a complete request head (HeadEnd's bytes),
// into r, reusing r.Fields' array. It accepts HTTP/1.1 requests in
// origin-form with exactly one valid Host (see ValidHost) and a body
// framed by at most one Content-Length or by chunked alone.
func ParseRequest(head []byte, r *Request) error {
	fields := r.Fields[:0]
	*r = Request{}
	line, rest, ok := cutLine(head)
	if !ok {
		return ErrHead
	}
	method, rest1, ok1 := bytes.Cut(line, sp)
	target, proto, ok2 := bytes.Cut(rest1, sp)
	if !ok1 || !ok2 || !isToken(method) || string(proto) != "HTTP/1.1" || !validTarget(target) {
		return ErrHead
	}
	r.Method, r.Target = method, target
	var err error
	fields, err = parseFields(rest, fields)
	r.Fields = fields
	if err != nil {
		return err
	}
	hosts := 0
	for _, f := range fields {
		if equalFold(f.Name, "Host") {
			hosts++
			r.Host = f.Value
		}
	}
	if hosts != 1 || !ValidHost(r.Host) {
		return ErrHost
	}
	r.ContentLength, r.Close, _, err = framing(fields, true)
	if err != nil {
		return err
	}
	if r.ContentLength == UntilClose {
		r.ContentLength = 0 // a request without framing has no body
	}
	return nil
}

// ParseResponse parses head, a complete response head, into r, reusing
// r.Fields' array. It accepts HTTP/1.1 and HTTP/1.0 with a three-digit
// status from 100 to 599.
func ParseResponse(head []byte, r *Response) error {
	fields := r.Fields[:0]
	*r = Response{}
	line, rest, ok := cutLine(head)
	if !ok || len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' {
		return ErrHead
	}
	switch line[7] {
	case '0':
		r.Minor = 0
	case '1':
		r.Minor = 1
	default:
		return ErrHead
	}
	code := line[9:12]
	if code[0] < '1' || code[0] > '5' || !isDigit(code[1]) || !isDigit(code[2]) {
		return ErrHead
	}
	r.Status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if len(line) > 12 {
		if line[12] != ' ' {
			return ErrHead
		}
		r.Reason = line[13:]
		for _, b := range r.Reason {
			if !isValueByte(b) {
				return ErrHead
			}
		}
	}
	var err error
	fields, err = parseFields(rest, fields)
	r.Fields = fields
	if err != nil {
		return err
	}
	var keepAlive bool
	r.ContentLength, r.Close, keepAlive, err = framing(fields, false)
	if err != nil {
		return err
	}
	if r.Minor == 0 {
		if r.ContentLength == Chunked {
			// net/http ignores Transfer-Encoding in HTTP/1.0 and reads
			// to the close: refused, not read two ways.
			return ErrUnsupported
		}
		if !keepAlive {
			r.Close = true
		}
	}
	return nil
}

var sp = []byte(" ")

// cutLine cuts the first CRLF-ended line off b.
func cutLine(b []byte) (line, rest []byte, ok bool) {
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return nil, nil, false
	}
	return b[:i], b[i+2:], true
}

// parseFields parses the field lines of a head after its start line, up
// to and including the empty line that ends it, which must end b. Each
// line is read in one pass: a name of token bytes, a colon, value bytes up
// to CRLF (a lone CR or LF, or any other control, is not one).
func parseFields(b []byte, fields []Field) ([]Field, error) {
	for {
		if len(b) >= 2 && b[0] == '\r' && b[1] == '\n' {
			if len(b) != 2 {
				return fields, ErrHead
			}
			return fields, nil
		}
		i := 0
		for i < len(b) && tokenBytes[b[i]] {
			i++
		}
		if i == 0 || i == len(b) || b[i] != ':' {
			return fields, ErrHead // also obs-fold: a line that starts blank
		}
		j := i + 1
		for j < len(b) && isValueByte(b[j]) {
			j++
		}
		if j+1 >= len(b) || b[j] != '\r' || b[j+1] != '\n' {
			return fields, ErrHead // CR, LF, NUL and other controls
		}
		fields = append(fields, Field{Name: b[:i], Value: trimBlanks(b[i+1 : j])})
		b = b[j+2:]
	}
}

// framing reads the body framing and connection options of fields: the
// body's length (UntilClose without framing), whether a Connection field
// says close, and whether one says keep-alive.
// A Transfer-Encoding other than chunked (identity included) is
// ErrUnsupported, as net/http answers it (501).
func framing(fields []Field, request bool) (length int64, closeConn, keepAlive bool, err error) {
	length = UntilClose
	lengths, encodings := 0, 0
	for _, f := range fields {
		switch {
		case equalFold(f.Name, "Content-Length"):
			lengths++
			n, ok := parseLength(f.Value)
			if !ok {
				return 0, false, false, ErrFraming
			}
			length = n
		case equalFold(f.Name, "Transfer-Encoding"):
			switch {
			case equalFold(f.Value, "chunked"):
				encodings++
			default:
				return 0, false, false, ErrUnsupported
			}
		case equalFold(f.Name, "Connection"):
			for opt := range bytes.SplitSeq(f.Value, []byte(",")) {
				switch opt = trimBlanks(opt); {
				case equalFold(opt, "close"):
					closeConn = true
				case equalFold(opt, "keep-alive"):
					keepAlive = true
				}
			}
		}
	}
	switch {
	case lengths > 1 || encodings > 1 || lengths > 0 && encodings > 0:
		return 0, false, false, ErrFraming
	case encodings == 1:
		length = Chunked
	}
	return length, closeConn, keepAlive, nil
}

// parseLength parses a Content-Length value: 1 to 18 decimal digits.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > maxContentDigits {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// validTarget reports whether t is an origin-form target the loops
// forward: '/' first, then visible ASCII only, and every '%' followed by
// two hex digits (net/url refuses a request whose escapes are broken).
func validTarget(t []byte) bool {
	if len(t) == 0 || t[0] != '/' {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c <= ' ' || c >= 0x7f:
			return false
		case c == '%':
			if i+2 >= len(t) || !isHex(t[i+1]) || !isHex(t[i+2]) {
				return false
			}
		}
	}
	return true
}

// ValidHost reports whether h is a Host value the loops accept: a
// registered name of letters, digits, '-', '.', '_' and '~', an IPv4
// address, or an IPv6 address in brackets, then an optional ':' and port
// digits. Anything that could be read as a path, a query, a fragment, an
// escape or a second authority ('/', '\', '?', '#', '%', '@', blanks, an
// unbalanced bracket) is refused.
func ValidHost(h []byte) bool {
	if len(h) == 0 {
		return false
	}
	host, port := h, []byte(nil)
	if h[0] == '[' {
		end := bytes.IndexByte(h, ']')
		if end < 2 {
			return false
		}
		for _, c := range h[1:end] {
			if !isHex(c) && c != ':' && c != '.' {
				return false
			}
		}
		switch rest := h[end+1:]; {
		case len(rest) == 0:
			return true
		case rest[0] != ':':
			return false
		default:
			port = rest[1:]
		}
		return validPort(port)
	}
	if i := bytes.IndexByte(h, ':'); i >= 0 {
		host, port = h[:i], h[i+1:]
		if !validPort(port) {
			return false
		}
	}
	if len(host) == 0 {
		return false
	}
	for _, c := range host {
		if !isDigit(c) && !isLetter(c) && c != '-' && c != '.' && c != '_' && c != '~' {
			return false
		}
	}
	return true
}

// validPort: 1 to 5 digits (an empty port after ':' is refused).
func validPort(p []byte) bool {
	if len(p) == 0 || len(p) > 5 {
		return false
	}
	for _, c := range p {
		if !isDigit(c) {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isLetter(c byte) bool { return 'a' <= lower(c) && lower(c) <= 'z' }

// isToken reports whether b is a non-empty token (RFC 9110 §5.6.2).
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTokenByte(c) {
			return false
		}
	}
	return true
}

// isTokenByte reports whether c is a tchar.
func isTokenByte(c byte) bool { return tokenBytes[c] }

// tokenBytes holds true for each tchar (RFC 9110 §5.6.2): digits, letters
// and these: !#$%&'*+-.^_`|~
var tokenBytes = func() (t [256]bool) {
	for c := range 256 {
		t[c] = isDigit(byte(c)) || isLetter(byte(c)) || strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0
	}
	return t
}()

// isValueByte reports whether c may appear in a field value: HTAB, SP,
// VCHAR and obs-text, as net/textproto accepts.
func isValueByte(c byte) bool {
	return c == '\t' || c >= ' ' && c != 0x7f
}

func trimBlanks(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// equalFold reports whether b equals the ASCII string s in any case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		if lower(b[i]) != lower(s[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
