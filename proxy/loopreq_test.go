package proxy

import (
	"net/http"
	"net/textproto"
	"testing"

	"github.com/fencegate/fencegate/internal/h1"
)

// FuzzCanonicalize: the loops' field names are net/http's, for every name
// h1 accepts in a head.
func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{"content-type", "CONTENT-LENGTH", "fencing-token", "Fencing_Token", "x-a-", "-x", "a--b", "te", "X-Forwarded-For", "x1-2y", "~!#$%&'*+.^_`|"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		var r loopRequest
		if err := r.parse([]byte("GET / HTTP/1.1\r\nHost: gate\r\n" + name + ": v\r\n\r\n")); err != nil {
			t.Skip("h1 refuses it")
		}
		f := r.head.Fields[len(r.head.Fields)-1]
		if len(f.Name) != len(name) {
			t.Skip("not one field name") // such as "a: b"
		}
		if want := textproto.CanonicalMIMEHeaderKey(name); string(f.Name) != want {
			t.Fatalf("%q: the loops read %q, net/http %q", name, f.Name, want)
		}
	})
}

// TestLoopRequestOwnsItsHead: the parsed request is the loop's own copy,
// unchanged when the bytes it was read from are overwritten (the
// connection's buffer, by the next read).
func TestLoopRequestOwnsItsHead(t *testing.T) {
	buf := []byte("PUT /jobs/1 HTTP/1.1\r\nHost: gate\r\nfencing-token: 7\r\nContent-Length: 0\r\n\r\n")
	var r loopRequest
	if err := r.parse(buf); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 'x'
	}
	if got := string(r.value(HeaderToken)); got != "7" || string(r.head.Target) != "/jobs/1" || string(r.head.Host) != "gate" {
		t.Fatalf("after the buffer changed: token %q, target %q, host %q", got, r.head.Target, r.head.Host)
	}
	if err := r.parse([]byte("GET / HTTP/1.0\r\n\r\n")); err != h1.ErrHead {
		t.Fatalf("HTTP/1.0: %v, want h1's refusal", err)
	}
}

// TestAnswerClose: the gate's own answer closes the connection when one of
// its Connection fields names close, in any case and list position, and
// only then.
func TestAnswerClose(t *testing.T) {
	for _, tc := range []struct {
		conn []string
		want bool
	}{
		{nil, false},
		{[]string{"close"}, true},
		{[]string{"keep-alive, Close"}, true},
		{[]string{"keep-alive", " close "}, true},
		{[]string{"closed"}, false},
		{[]string{"keep-alive, x-close"}, false},
	} {
		r := loopRequest{answer: http.Header{}}
		if tc.conn != nil {
			r.answer["Connection"] = tc.conn
		}
		if got := r.answerClose(); got != tc.want {
			t.Errorf("Connection %q: answerClose() = %v, want %v", tc.conn, got, tc.want)
		}
	}
}
