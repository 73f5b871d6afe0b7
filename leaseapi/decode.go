package leaseapi

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"sync"
)

// decodeJSON decodes exactly one JSON object from body into dst (a pointer
// to a struct with json tags), with the rules and the answers of
// decodeJSONStream, which stays the reference: every body gets from
// decodeJSON what it gets from decodeJSONStream (FuzzDecodeAgrees).
//
// The usual body, a small object whose member names are the fields' own,
// spelled exactly, each once and without escapes, takes a quicker path:
// the body is read whole, its top-level names are checked against the
// fields, and json.Unmarshal checks it as JSON and fills dst. Anything
// else (a read error, a body over its limit, invalid JSON, a name that is
// unknown, repeated, in another case or escaped, a value of the wrong type)
// is decoded again by decodeJSONStream from the same bytes, followed by the
// same read error, so its refusal is the reference's, word for word. The
// quick path costs a third of the stream decoder's time per lease call
// (BenchmarkDecodeBody).
func decodeJSON(body io.Reader, limit int64, dst any) error {
	raw, err := readBody(body, -1, limit)
	return decodeRead(raw, err, limit, dst)
}

// decodeRead is decodeJSON of a body already read: raw, its bytes, and
// err, the error that ended its reading early (nil at its end).
func decodeRead(raw []byte, err error, limit int64, dst any) error {
	// Unmarshal checks the whole body before it fills anything, so a
	// malformed one leaves dst as it was. One it fills and then refuses (a
	// value of the wrong type) the reference refuses too, whatever dst holds.
	if err == nil && namesAreFields(raw, fieldNames(reflect.TypeOf(dst).Elem())) &&
		json.Unmarshal(raw, dst) == nil {
		return nil
	}
	var replay io.Reader = bytes.NewReader(raw)
	if err != nil {
		replay = io.MultiReader(replay, failingReader{err})
	}
	return decodeJSONStream(replay, limit, dst)
}

// readBody reads body to its end, as io.ReadAll does (the bytes, and the
// error that ended it early, nil at its end), into one buffer sized from
// size, the body's declared length, when it has one within limit: no
// growth by doubling, no copy, so a body holds its own length in memory
// and no more. A body without a declared length (size -1) grows from a
// small buffer as io.ReadAll's does, up to limit (the caller bounds body
// with http.MaxBytesReader).
func readBody(body io.Reader, size, limit int64) ([]byte, error) {
	if size < 0 || size > limit {
		return io.ReadAll(body)
	}
	b := make([]byte, 0, size+1) // one more byte: room for the read that sees the end
	for {
		n, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			// Longer than declared: not from net/http, which holds a
			// body to its Content-Length.
			b = append(b, 0)[:len(b)]
		}
	}
}

// failingReader returns err: the read error that ended a body, after its
// bytes, for decodeJSONStream to see where the body's reader showed it.
type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

// fieldNamesCache maps a struct type to its fields' json names.
var fieldNamesCache sync.Map // reflect.Type -> []string

// fieldNames returns the json names of t's fields, by field index ("" for
// a field without one or with "-"), read once per type.
func fieldNames(t reflect.Type) []string {
	if names, ok := fieldNamesCache.Load(t); ok {
		return names.([]string)
	}
	names := make([]string, t.NumField())
	for i := range names {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); tag != "-" {
			names[i] = tag
		}
	}
	fieldNamesCache.Store(t, names)
	return names
}

// maxQuickFields bounds the structs namesAreFields checks (its record of
// the names seen lives on the stack).
const maxQuickFields = 16

// namesAreFields reports whether raw, if it is valid JSON, is an object
// whose member names are all among names, spelled exactly, each at most
// once, none with an escape sequence (those are left to the reference
// decoder, which unescapes them). It walks the top level only, skipping
// strings, nested objects and arrays, and does not check the JSON itself
// (json.Unmarshal does, after it): on malformed input its answer means
// nothing, but it never reads past raw.
func namesAreFields(raw []byte, names []string) bool {
	if len(names) > maxQuickFields {
		return false
	}
	var seen [maxQuickFields]bool
	depth, wantName := 0, false
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '"':
			if depth == 0 {
				return false // a string, not an object
			}
			end, escaped := i+1, false
			for ; end < len(raw) && raw[end] != '"'; end++ {
				if raw[end] == '\\' {
					escaped = true
					end++ // the escaped byte, which may be a quote
				}
			}
			if end >= len(raw) {
				return false // the string does not end
			}
			if depth == 1 && wantName {
				f := indexOf(names, raw[i+1:end])
				if escaped || f < 0 || seen[f] {
					return false
				}
				seen[f] = true
				wantName = false
			}
			i = end
		case '{':
			depth++
			wantName = depth == 1
		case '[':
			if depth == 0 {
				return false // an array, not an object
			}
			depth++
		case '}', ']':
			depth--
		case ',':
			wantName = depth == 1
		default:
			if depth == 0 && !isJSONSpace(raw[i]) {
				return false // a scalar, not an object
			}
		}
	}
	return true
}

// indexOf returns the index of the non-empty name equal to b, or -1.
func indexOf[S string | []byte](names []string, b S) int {
	for i, n := range names {
		if n != "" && n == string(b) {
			return i
		}
	}
	return -1
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
