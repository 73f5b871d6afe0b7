package proxy

import (
	"iter"
	"net"
	"net/http"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegate/fencegate/internal/h1"
)

// loopRequest is a request the event loops read (loopread_linux.go), as
// the gate judges and forwards it, and the answer the gate gives it itself
// (a refusal, a problem). One per client connection, reused request after
// request.
//
// Its head is h1's parse of the connection's own copy of the head bytes,
// so nothing the loop reads next can change it while the exchange lasts;
// its field names are rewritten in canonical form ("content-type" becomes
// "Content-Type"), the form net/http's reader gives the general engine, so
// that both engines compare the same names (TestUpstreamHeadAgrees).
type loopRequest struct {
	raw  []byte // the head's bytes: the fields alias them
	head h1.Request
	body []byte // a copy of the body

	remote *net.TCPAddr
	tls    bool // its TLS is terminated by a relay (X-Forwarded-Proto: https)

	// status is the answer's status once known (the upstream's or the
	// gate's), for telemetry; 0 before.
	status int
	// answer and answerBody are the answer the gate made itself
	// (writeProblem): its header fields (Content-Length and the framing
	// aside, which the loop writes) and its body.
	answer     http.Header
	answerBody []byte
}

// parse reads head, a complete request head (h1.HeadEnd's bytes), into r
// from a copy of it. An error is h1's: the head is outside what the loops
// read.
func (r *loopRequest) parse(head []byte) error {
	r.raw = append(r.raw[:0], head...)
	if err := h1.ParseRequest(r.raw, &r.head); err != nil {
		return err
	}
	for _, f := range r.head.Fields {
		canonicalize(f.Name)
	}
	return nil
}

// setBody keeps a copy of body as the request's.
func (r *loopRequest) setBody(body []byte) { r.body = append(r.body[:0], body...) }

// reset forgets the request and its answer, keeping the buffers.
func (r *loopRequest) reset() {
	r.raw, r.body = r.raw[:0], r.body[:0]
	r.head = h1.Request{Fields: r.head.Fields[:0]}
	r.status = 0
	clear(r.answer)
	r.answerBody = nil
}

// value is the value of the first field named name (in canonical form),
// or nil.
func (r *loopRequest) value(name string) []byte {
	for _, f := range r.head.Fields {
		if string(f.Name) == name {
			return f.Value
		}
	}
	return nil
}

// last is the value of the last field named name (in canonical form), or
// nil.
func (r *loopRequest) last(name string) []byte {
	var v []byte
	for _, f := range r.head.Fields {
		if string(f.Name) == name {
			v = f.Value
		}
	}
	return v
}

// fields yields the request's header fields in the order they came, names
// in canonical form.
func (r *loopRequest) fields() iter.Seq2[[]byte, []byte] {
	return func(yield func(k, v []byte) bool) {
		for _, f := range r.head.Fields {
			if !yield(f.Name, f.Value) {
				return
			}
		}
	}
}

// isHead reports whether the request is a HEAD, whose answer has no body.
func (r *loopRequest) isHead() bool { return string(r.head.Method) == http.MethodHead }

// closeAfter reports whether the client asked to close the connection
// after this exchange (Connection: close).
func (r *loopRequest) closeAfter() bool { return r.head.Close }

// canonicalize rewrites name, a valid field name (an RFC 9110 token), in
// place into the form textproto.CanonicalMIMEHeaderKey gives it: upper
// case at the start and after each hyphen, lower case elsewhere.
func canonicalize(name []byte) {
	upper := true
	for i, c := range name {
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		name[i] = c
		upper = c == '-'
	}
}

// answerClose reports whether the gate's own answer asks to close the
// connection (a Connection field naming close).
func (r *loopRequest) answerClose() bool {
	return httpguts.HeaderValuesContainsToken(r.answer["Connection"], "close")
}
