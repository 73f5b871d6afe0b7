package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"slices"
	"testing"
)

// readChunked reads a chunked body and its trailer from b as net/http
// does (httputil.NewChunkedReader, then the trailer as body.readTrailer
// reads it), and returns how many bytes of b the body took.
func readChunked(b []byte) (int, error) {
	br := bufio.NewReader(bytes.NewReader(b))
	if _, err := io.Copy(io.Discard, httputil.NewChunkedReader(br)); err != nil {
		return 0, err
	}
	if p, _ := br.Peek(2); string(p) == "\r\n" {
		_, _ = br.Discard(2)
	} else if _, err := textproto.NewReader(br).ReadMIMEHeader(); err != nil {
		return 0, err
	}
	return len(b) - br.Buffered(), nil
}

// FuzzChunkScanner holds the scanner to net/http's chunked reader: where
// the scanner finds a body's end, net/http reads the same body to the same
// end without an error; where the scanner wants more, net/http finds no
// end either. The scanner may refuse what net/http reads (never the other
// way round), and whatever the cut, it finds the same end.
func FuzzChunkScanner(f *testing.F) {
	for _, s := range []string{
		"0\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n", "5;a=b\r\nhello\r\n0\r\nX: y\r\n\r\nNEXT",
		"5 \r\nhello\r\n0\r\n\r\n", "8000000000000000\r\n", "7fffffffffffffff\r\nab",
		"0000000000000003\r\nabc\r\n0\r\n\r\n", "3\r\nabc\n0\r\n\r\n", "0\r\n X: 1\r\n\r\n",
	} {
		f.Add([]byte(s), uint16(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		var s ChunkScanner
		n, done, err := s.Scan(b)
		if err != nil {
			return // refused: the relay is cut off, whatever net/http says
		}
		if n > len(b) || !done && n != len(b) {
			t.Fatalf("n=%d of %d, done=%v", n, len(b), done)
		}
		want, oerr := readChunked(b)
		switch {
		case done && oerr != nil:
			t.Fatalf("the scanner ends the body at %d; net/http: %v", n, oerr)
		case done && want != n:
			t.Fatalf("the scanner ends the body at %d; net/http at %d", n, want)
		case !done && oerr == nil:
			t.Fatalf("the scanner wants more; net/http ends the body at %d", want)
		}
		// Cut anywhere, the same end.
		c := int(cut) % (len(b) + 1)
		var s2 ChunkScanner
		n1, done1, err1 := s2.Scan(b[:c])
		if err1 != nil {
			t.Fatalf("cut at %d: %v", c, err1)
		}
		if done1 {
			if !done || n1 != n {
				t.Fatalf("cut at %d: end %d, whole: %d %v", c, n1, n, done)
			}
			return
		}
		n2, done2, err2 := s2.Scan(b[c:])
		if err2 != nil || done2 != done || done && n1+n2 != n {
			t.Fatalf("cut at %d: %d+%d %v %v; whole: %d %v", c, n1, n2, done2, err2, n, done)
		}
	})
}

// grouped is fields as net/http's Header holds them: by canonical name,
// values in order.
func grouped(fields []Field) http.Header {
	h := http.Header{}
	for _, f := range fields {
		k := textproto.CanonicalMIMEHeaderKey(string(f.Name))
		h[k] = append(h[k], string(f.Value))
	}
	return h
}

// sameHeader compares ours with net/http's, but for what net/http adds or
// removes on its own (Host, Cache-Control for Pragma, Connection when it
// closes, framing fields it rewrites).
func sameHeader(ours, theirs http.Header, skip ...string) bool {
	ours, theirs = ours.Clone(), theirs.Clone()
	for _, k := range append(skip, "Cache-Control") {
		delete(ours, k)
		delete(theirs, k)
	}
	if len(ours) != len(theirs) {
		return false
	}
	for k, v := range ours {
		if !slices.Equal(v, theirs[k]) {
			return false
		}
	}
	return true
}

var requestSeeds = []string{
	"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
	"PUT /jobs/1?x=%41 HTTP/1.1\r\nHost: gate.example:8080\r\nContent-Length: 5\r\nFencing-Token: 7\r\n\r\n",
	"POST /x HTTP/1.1\r\nHost: [::1]:80\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
	"PUT /x HTTP/1.1\r\nHost: x/../jobs/b\r\n\r\n", "PUT /x HTTP/1.1\r\nHost: [::1\r\n\r\n",
	"PUT /x HTTP/1.1\r\nHost: %2e%2e\r\n\r\n", "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
	"PUT /x HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", "PUT /%zz HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.0\r\nHost: a\r\n\r\n", "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
}

// FuzzParseRequest holds ParseRequest to http.ReadRequest: a head it
// accepts, net/http reads with the same method, target, Host, fields, body
// length and connection close.
func FuzzParseRequest(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		end := HeadEnd(b)
		if end < 0 {
			return
		}
		head := b[:end]
		if err := ParseRequest(head, &r); err != nil {
			return
		}
		if BareLineEnd(head) {
			t.Fatalf("accepted a head with a bare line end: %q", head)
		}
		if hasIdentity(r.Fields) {
			return // framed by its length by choice; net/http refuses it (see framing)
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
		if err != nil {
			t.Fatalf("accepted %q; net/http: %v", head, err)
		}
		wantLen := r.ContentLength
		if r.ContentLength == Chunked {
			if !slices.Equal(req.TransferEncoding, []string{"chunked"}) {
				t.Fatalf("%q: chunked; net/http: %q", head, req.TransferEncoding)
			}
		}
		switch {
		case req.Method != string(r.Method), req.RequestURI != string(r.Target), req.Host != string(r.Host):
			t.Fatalf("%q: %q %q %q; net/http: %q %q %q", head, r.Method, r.Target, r.Host, req.Method, req.RequestURI, req.Host)
		case req.ContentLength != wantLen:
			t.Fatalf("%q: length %d; net/http: %d", head, wantLen, req.ContentLength)
		case req.Close != r.Close:
			t.Fatalf("%q: close %v; net/http: %v", head, r.Close, req.Close)
		case !sameHeader(grouped(r.Fields), req.Header, "Host", "Transfer-Encoding"):
			t.Fatalf("%q: fields %q; net/http: %q", head, grouped(r.Fields), req.Header)
		}
	})
}

// hasIdentity reports whether fields have a Transfer-Encoding: identity.
func hasIdentity(fields []Field) bool {
	for _, f := range fields {
		if equalFold(f.Name, "Transfer-Encoding") && equalFold(f.Value, "identity") {
			return true
		}
	}
	return false
}

var responseSeeds = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
	"HTTP/1.1 204\r\n\r\n", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: close\r\nX-A: 1\r\nx-a: 2\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
	"HTTP/1.1 100 Continue\r\n\r\n", "HTTP/1.1 +12 OK\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
}

// FuzzParseResponse holds ParseResponse to http.ReadResponse (for a GET):
// a head it accepts, net/http reads with the same status, fields, body
// framing and connection close.
func FuzzParseResponse(f *testing.F) {
	for _, s := range responseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Response
		end := HeadEnd(b)
		if end < 0 {
			return
		}
		head := b[:end]
		if err := ParseResponse(head, &r); err != nil {
			return
		}
		if BareLineEnd(head) {
			t.Fatalf("accepted a head with a bare line end: %q", head)
		}
		// The body's framing is compared on a stream with a body behind
		// the head, long enough for any length this test can make.
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(head)), &http.Request{Method: http.MethodGet})
		if err != nil {
			t.Fatalf("accepted %q; net/http: %v", head, err)
		}
		bodyAllowed := r.Status >= 200 && r.Status != http.StatusNoContent && r.Status != http.StatusNotModified
		wantClose := r.Close || bodyAllowed && r.ContentLength == UntilClose
		switch {
		case resp.StatusCode != r.Status:
			t.Fatalf("%q: status %d; net/http: %d", head, r.Status, resp.StatusCode)
		case resp.ProtoMinor != r.Minor:
			t.Fatalf("%q: HTTP/1.%d; net/http: %d", head, r.Minor, resp.ProtoMinor)
		case resp.Close != wantClose:
			t.Fatalf("%q: close %v; net/http: %v", head, wantClose, resp.Close)
		case !sameHeader(grouped(r.Fields), resp.Header, "Connection", "Content-Length", "Transfer-Encoding"):
			t.Fatalf("%q: fields %q; net/http: %q", head, grouped(r.Fields), resp.Header)
		}
		if !bodyAllowed {
			return
		}
		switch r.ContentLength {
		case Chunked:
			if !slices.Equal(resp.TransferEncoding, []string{"chunked"}) {
				t.Fatalf("%q: chunked; net/http: %q", head, resp.TransferEncoding)
			}
		case UntilClose:
			if resp.ContentLength != -1 || resp.TransferEncoding != nil {
				t.Fatalf("%q: until the close; net/http: %d %q", head, resp.ContentLength, resp.TransferEncoding)
			}
		default:
			if resp.ContentLength != r.ContentLength || resp.TransferEncoding != nil {
				t.Fatalf("%q: length %d; net/http: %d %q", head, r.ContentLength, resp.ContentLength, resp.TransferEncoding)
			}
		}
	})
}
