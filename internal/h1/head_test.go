package h1

import (
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

func TestHeadEndAndBareLineEnd(t *testing.T) {
	if n := HeadEnd([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\nNEXT")); n != 27 {
		t.Errorf("HeadEnd = %d, want 27", n)
	}
	if n := HeadEnd([]byte("GET / HTTP/1.1\r\nHost: a\r\n\n")); n != -1 {
		t.Errorf("HeadEnd of an unfinished head = %d", n)
	}
	for s, want := range map[string]bool{
		"a\r\nb\r\n": false, "a\r": false, "a\nb": true, "\n": true, "a\rb": true, "a\x00": true, "": false,
	} {
		if got := BareLineEnd([]byte(s)); got != want {
			t.Errorf("BareLineEnd(%q) = %v", s, got)
		}
	}
}

// TestParseRequest covers the subset the loops take and what they hand
// on: the Host shapes the general path refuses, framing that conflicts,
// obs-fold, broken escapes, other protocols.
func TestParseRequest(t *testing.T) {
	var r Request
	head := "PUT /jobs/1?x=%41 HTTP/1.1\r\nHost: gate.example:8080\r\ncontent-length: 0005\r\nX-A:  v w \t\r\nConnection: keep-alive, Close\r\n\r\n"
	if err := ParseRequest([]byte(head), &r); err != nil {
		t.Fatal(err)
	}
	if string(r.Method) != "PUT" || string(r.Target) != "/jobs/1?x=%41" || string(r.Host) != "gate.example:8080" ||
		r.ContentLength != 5 || !r.Close || len(r.Fields) != 4 || string(r.Fields[2].Value) != "v w" {
		t.Fatalf("%+v", r)
	}
	if err := ParseRequest([]byte("POST / HTTP/1.1\r\nHost: [::1]\r\nTransfer-Encoding: Chunked\r\n\r\n"), &r); err != nil || r.ContentLength != Chunked || r.Close {
		t.Fatalf("chunked: %v %+v", err, r)
	}
	if err := ParseRequest([]byte("DELETE / HTTP/1.1\r\nHost: a\r\n\r\n"), &r); err != nil || r.ContentLength != 0 || len(r.Fields) != 1 {
		t.Fatalf("no body: %v %+v", err, r)
	}
	// identity beside a length is refused, as net/http refuses it (501).
	if err := ParseRequest([]byte("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nContent-Length: 3\r\n\r\n"), &r); err == nil {
		t.Fatalf("identity beside a length accepted: %+v", r)
	}
	bad := []string{
		// The Host shapes of issue "two engines, two judgements".
		"x/../jobs/b", "x y", `x\y`, "[::1", "x?y", "x#y", "%2e%2e",
		"", "a:", "a:123456", "a:x", "u@a", "[::1]x", "[]", "[::1]:", "a,b",
	}
	for _, h := range bad {
		if err := ParseRequest([]byte("PUT /x HTTP/1.1\r\nHost: "+h+"\r\n\r\n"), &r); err == nil {
			t.Errorf("Host %q accepted", h)
		}
	}
	for _, head := range []string{
		"PUT /x HTTP/1.1\r\n\r\n",                          // no Host
		"PUT /x HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",    // two
		"PUT /x HTTP/1.0\r\nHost: a\r\n\r\n",               // another protocol
		"PUT http://a/x HTTP/1.1\r\nHost: a\r\n\r\n",       // absolute-form
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",            // asterisk-form
		"PUT /%zz HTTP/1.1\r\nHost: a\r\n\r\n",             // a broken escape
		"PUT /x%4 HTTP/1.1\r\nHost: a\r\n\r\n",             // a cut escape
		"PUT /a b HTTP/1.1\r\nHost: a\r\n\r\n",             // a blank in the target
		"PUT  /x HTTP/1.1\r\nHost: a\r\n\r\n",              // two blanks
		"P(T /x HTTP/1.1\r\nHost: a\r\n\r\n",               // not a token
		"PUT /x HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", // obs-fold
		"PUT /x HTTP/1.1\r\nHost: a\r\nX : a\r\n\r\n",      // a blank before the colon
		"PUT /x HTTP/1.1\r\nHost: a\r\nX: a\x00\r\n\r\n",   // NUL
		"PUT /x HTTP/1.1\r\nHost: a\r\nX: a\nY: b\r\n\r\n", // a bare LF
		"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1,1\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: " + strings.Repeat("9", 19) + "\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", // identity without a length
		"PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nTransfer-Encoding: identity\r\nContent-Length: 1\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
		"PUT /x HTTP/1.1\r\nHost: a\r\n\r\nX", // bytes after the head
		"PUT /x HTTP/1.1\r\nHost: a\r\n",      // no end
	} {
		if err := ParseRequest([]byte(head), &r); err == nil {
			t.Errorf("%q accepted", head)
		}
	}
}

func TestParseResponse(t *testing.T) {
	var r Response
	cases := []struct {
		head   string
		status int
		length int64
		close  bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", 200, 12, false},
		{"HTTP/1.1 404 Not  Found\r\nTransfer-Encoding: chunked\r\n\r\n", 404, Chunked, false},
		{"HTTP/1.1 200\r\n\r\n", 200, UntilClose, false},
		{"HTTP/1.1 204 \r\nConnection: close\r\n\r\n", 204, UntilClose, true},
		{"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", 200, 0, true},
		{"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n", 200, 0, false},
		{"HTTP/1.1 100 Continue\r\n\r\n", 100, UntilClose, false},
	}
	for _, c := range cases {
		if err := ParseResponse([]byte(c.head), &r); err != nil || r.Status != c.status || r.ContentLength != c.length || r.Close != c.close {
			t.Errorf("%q: %v %+v", c.head, err, r)
		}
	}
	for _, head := range []string{
		"HTTP/1.1 +12 OK\r\n\r\n", "HTTP/1.1 099 X\r\n\r\n", "HTTP/1.1 600 X\r\n\r\n", "HTTP/1.1 20 X\r\n\r\n",
		"HTTP/1.1 2000\r\n\r\n", "HTTP/2.0 200 OK\r\n\r\n", "HTTP/1.2 200 OK\r\n\r\n", "http/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 200 O\x00K\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\r\n\tb\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", // net/http reads to the close
	} {
		if err := ParseResponse([]byte(head), &r); err == nil {
			t.Errorf("%q accepted", head)
		}
	}
}

func TestAppendHelpers(t *testing.T) {
	got := string(AppendStatusLine(nil, 404, nil)) + string(AppendStatusLine(nil, 200, []byte("Fine"))) +
		string(AppendField(nil, []byte("X-A"), []byte("b"))) + string(AppendContentLength(nil, 42))
	if want := "HTTP/1.1 404 Not Found\r\nHTTP/1.1 200 Fine\r\nX-A: b\r\nContent-Length: 42\r\n"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}

// BenchmarkParseResponse: the loops parse one response head per request.
func BenchmarkParseResponse(b *testing.B) {
	head := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: Thu, 03 Dec 2026 06:00:00 GMT\r\nContent-Length: 17\r\n\r\n")
	var r Response
	b.ReportAllocs()
	for b.Loop() {
		if err := ParseResponse(head, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseRequest: the loops parse one request head per request.
func BenchmarkParseRequest(b *testing.B) {
	head := []byte("PUT /jobs/17 HTTP/1.1\r\nHost: app:8080\r\nUser-Agent: worker/1.0\r\nContent-Type: application/json\r\nFencing-Token: 1796631549936590\r\nContent-Length: 10\r\n\r\n")
	var r Request
	b.ReportAllocs()
	for b.Loop() {
		if err := ParseRequest(head, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// TestTokenBytes holds the table of tchars to net/http's own.
func TestTokenBytes(t *testing.T) {
	for c := range 256 {
		if got, want := isTokenByte(byte(c)), httpguts.IsTokenRune(rune(c)); got != want {
			t.Errorf("isTokenByte(%q) = %v, net/http says %v", byte(c), got, want)
		}
	}
}
