package proxy

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/internal/certs/certstest"
)

// tlsHostile is a gate serving HTTPS (as the binary serves
// FENCEGATE_PROXY_TLS_CERT: HTTP/1.1 on the event loops through a TLS
// relay, HTTP/2 on the general engine; or, with noLoops, as
// FENCEGATE_TLS_LOOPS=false does, everything on the general engine) and
// the client side of its TLS.
type tlsHostile struct {
	server, client *tls.Config
	noLoops        bool
}

// tlsWays are the two ways a TLS listener is served, named for subtests.
var tlsWays = []struct {
	name    string
	noLoops bool
}{{"", false}, {" (general engine)", true}}

func newTLSHostile(t *testing.T) tlsHostile {
	t.Helper()
	ca := certstest.NewCA(t, "hostile CA")
	return tlsHostile{
		server: &tls.Config{Certificates: []tls.Certificate{ca.Server(t).TLS(t)}},
		client: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"},
	}
}

// env serves the hostile gate over TLS; its clients offer protos by ALPN.
func (h tlsHostile) env(t *testing.T, header bool, protos ...string) *hostileEnv {
	t.Helper()
	e := newHostileEnvOn(t, header, hostileWay{server: ServerOptions{HeaderTimeout: 5 * time.Second, TLS: h.server, NoTLSLoops: h.noLoops}})
	cfg := h.client.Clone()
	cfg.NextProtos = protos
	e.dial = func() (net.Conn, error) {
		c, err := tls.Dial("tcp", e.gateAddr, cfg)
		if err == nil && len(protos) > 0 && c.ConnectionState().NegotiatedProtocol != protos[0] {
			c.Close()
			return nil, fmt.Errorf("ALPN chose %q, not %q", c.ConnectionState().NegotiatedProtocol, protos[0])
		}
		return c, err
	}
	return e
}

// tlsHTTP1Answers are the shapes whose answer on a TLS listener served by
// the general engine alone (FENCEGATE_TLS_LOOPS=false) differs from the
// cleartext one, and why. net/http's server refuses a head it cannot read
// with a canned plain-text answer before the gate sees the request; on a
// cleartext listener the gate rewrites it into a problem (canned.go),
// under TLS it cannot (the connection carries ciphertext), so the client
// reads net/http's own status without a problem code. Nothing is
// forwarded either way: the upstream's record is judged the same. With
// the event loops serving TLS (the default), the loops and the general
// engine they hand over to see plaintext, and every shape gets its
// cleartext answer.
var tlsHTTP1Answers = map[string][]string{
	// Request lines net/http does not read.
	"two spaces after method":   {"400"},
	"two spaces before version": {"400"},
	"tab separator":             {"400"},
	"extra token in line":       {"400"},
	"no version":                {"400"},
	"HTTP/1.10":                 {"400"},
	"NUL in path":               {"400"},
	"HTTP/2.0 line":             {"505"},
	// Header fields it does not read.
	"space before a colon":       {"400"},
	"NUL in a header":            {"400"},
	"bare CR in a header":        {"400"},
	"header without colon":       {"400"},
	"TE with space before colon": {"400"},
	"head past 8 KiB":            {"431"},
	// Hosts it refuses (two of them, or a value httpguts.ValidHostHeader
	// rejects; the gate's own Host judgement refuses the rest as on
	// cleartext).
	"two Host headers":                   {"400"},
	"a second host header in lower case": {"400"},
	"Host with a path":                   {"400"},
	"Host with a space":                  {"400"},
	"Host with a backslash":              {"400"},
	"Host with a query":                  {"400"},
	"Host with a fragment":               {"400"},
	"Host on a read":                     {"400"},
	// Framings it refuses.
	"duplicate CL":            {"400"},
	"CL list":                 {"400"},
	"signed Content-Length":   {"400"},
	"TE identity beside CL":   {"501"},
	"TE identity with CL":     {"501"},
	"two Transfer-Encodings":  {"501"},
	"a coding before chunked": {"501"},
}

// TestHostileClientsTLS runs the hostile suite's shapes (hostileCases)
// over TLS: the same raw bytes after an HTTP/1.1 handshake (ALPN
// http/1.1) to the gate's TLS listener, judged from the upstream's own
// record as on cleartext; every request forwarded says it came over TLS
// from the client's address, whether the loops forwarded it or the
// general engine they handed it to. Both ways a TLS listener is served.
func TestHostileClientsTLS(t *testing.T) {
	cases := hostileCases()
	for name := range tlsHTTP1Answers {
		if !slices.ContainsFunc(cases, func(c hostileCase) bool { return c.name == name }) {
			t.Errorf("tlsHTTP1Answers names %q, which is no hostile shape", name)
		}
	}
	for _, way := range tlsWays {
		h := newTLSHostile(t)
		h.noLoops = way.noLoops
		for _, c := range cases {
			want := c.want
			if w, ok := tlsHTTP1Answers[c.name]; ok && h.noLoops {
				want = w
			}
			t.Run(c.name+way.name, func(t *testing.T) {
				t.Parallel()
				e := h.env(t, c.header, "http/1.1")
				e.judge(t, c.raw, want, c.forwarded)
				checkForwardedTLS(t, e)
			})
		}
	}
}

// checkForwardedTLS checks that every request the upstream received says
// it came over TLS from the client (the test's loopback address), not
// from the relay's socket pair.
func checkForwardedTLS(t *testing.T, e *hostileEnv) {
	t.Helper()
	for _, s := range e.up.requests() {
		if p := s.Header.Get("X-Forwarded-Proto"); p != "https" {
			t.Errorf("%s %s: X-Forwarded-Proto %q, want https", s.Method, s.Target, p)
		}
		if f := s.Header.Get("X-Forwarded-For"); f != "127.0.0.1" {
			t.Errorf("%s %s: X-Forwarded-For %q, want 127.0.0.1", s.Method, s.Target, f)
		}
	}
}

// h2Shape is a hostile shape as an HTTP/2 request: its request line and
// header fields become the pseudo-header and header fields of one stream
// (names in lower case, as HTTP/2 requires), its body one DATA frame.
type h2Shape struct {
	method, path, authority string
	fields                  []string // name, value pairs
	body                    string
	// withhold declares the body but sends none of it: the answer is read
	// first (a gate that waits for the body would never give one).
	withhold bool
	// more are DATA frames sent after body's, each after a pause, the
	// last ending the stream.
	more []string
}

// h2Connection are the fields HTTP/2 forbids (RFC 9113 §8.2.2): a shape
// carrying one is about HTTP/1.1's framing.
var h2Connection = []string{"connection", "upgrade", "keep-alive", "proxy-connection", "transfer-encoding", "te"}

// asH2 is the shape of raw as one HTTP/2 request, when raw is one
// HTTP/1.1 request whose meaning does not hang on HTTP/1.1's framing: CRLF
// line ends, a request line of three parts with an origin-form target,
// header fields of token names without folds, one Host, no field HTTP/2
// forbids, and exactly Content-Length bytes of body (nothing pipelined).
func asH2(raw string) (h2Shape, bool) {
	head, body, ok := strings.Cut(raw, "\r\n\r\n")
	if !ok || strings.Contains(strings.ReplaceAll(head, "\r\n", ""), "\n") {
		return h2Shape{}, false
	}
	lines := strings.Split(head, "\r\n")
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 || parts[2] != "HTTP/1.1" || !strings.HasPrefix(parts[1], "/") || !validToken(parts[0]) {
		return h2Shape{}, false
	}
	s := h2Shape{method: parts[0], path: parts[1], body: body}
	hosts, length := 0, -1
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if !ok || !validToken(name) {
			return h2Shape{}, false
		}
		name, value = strings.ToLower(name), strings.Trim(value, " \t")
		switch {
		case slices.Contains(h2Connection, name):
			return h2Shape{}, false
		case name == "host":
			hosts++
			s.authority = value
			continue
		case name == "content-length":
			n, err := strconv.Atoi(value)
			if err != nil || length >= 0 {
				return h2Shape{}, false
			}
			length = n
		}
		s.fields = append(s.fields, name, value)
	}
	if hosts != 1 || len(body) != max(length, 0) {
		return h2Shape{}, false
	}
	return s, true
}

// validToken reports whether s is an RFC 9110 token.
func validToken(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
	})
}

// tlsH2Answers are the shapes whose answer over HTTP/2 differs from the
// one over HTTP/1.1, each with the answers it may get (any one), and why:
// net/http's HTTP/2 server refuses them at the HTTP/2 layer, before the
// gate sees a request, where its HTTP/1.1 server answers 400 or 431.
// Nothing is forwarded either way.
var tlsH2Answers = map[string][]string{
	// A field value with NUL, CR or LF, or a :path with NUL, makes the
	// stream malformed (RFC 9113 §8.2.1): the stream is reset.
	"NUL in path":         {"RST_STREAM PROTOCOL_ERROR"},
	"NUL in a header":     {"RST_STREAM PROTOCOL_ERROR"},
	"bare CR in a header": {"RST_STREAM PROTOCOL_ERROR"},
	// A content-length that is not digits makes it malformed too, but
	// net/http reads it as 0 and runs the handler at once: the gate
	// refuses it (contentLengthProblem) or the DATA frame resets the
	// stream first, whichever comes first (TestH2ContentLengthNotANumber
	// takes the race out).
	"signed Content-Length": {"400 invalid-request", "RST_STREAM PROTOCOL_ERROR"},
	// A field longer than the header list the server allows does not
	// decode: the connection ends (HPACK's state is lost with it).
	"head past 8 KiB": {"GOAWAY COMPRESSION_ERROR"},
}

// TestHostileClientsH2TLS runs the hostile shapes that mean the same in
// HTTP/2 (asH2) as raw HTTP/2 streams over TLS (ALPN h2), each on a
// connection of its own, judged from the upstream's record like the
// HTTP/1.1 ones. The shapes about HTTP/1.1's framing (smuggling,
// malformed lines and fields, upgrades, pipelining) have HTTP/2
// counterparts of their own in TestHTTP2Abuse.
func TestHostileClientsH2TLS(t *testing.T) {
	for _, way := range tlsWays {
		h := newTLSHostile(t)
		h.noLoops = way.noLoops
		testHostileClientsH2TLS(t, h, way.name)
	}
}

func testHostileClientsH2TLS(t *testing.T, h tlsHostile, wayName string) {
	cases := hostileCases()
	for name := range tlsH2Answers {
		if !slices.ContainsFunc(cases, func(c hostileCase) bool { return c.name == name }) {
			t.Errorf("tlsH2Answers names %q, which is no hostile shape", name)
		}
	}
	ran := 0
	for _, c := range cases {
		s, ok := asH2(c.raw)
		if !ok {
			continue
		}
		ran++
		if len(c.want) != 1 {
			t.Fatalf("%s: one request, %d answers", c.name, len(c.want))
		}
		want := c.want
		if w, ok := tlsH2Answers[c.name]; ok {
			want = w
		}
		t.Run(c.name+wayName, func(t *testing.T) {
			t.Parallel()
			e := h.env(t, c.header, "h2")
			conn, err := e.dial()
			if err != nil {
				t.Fatal(err)
			}
			if got := sendH2(t, newRawH2(t, conn), s); !slices.Contains(want, got) {
				t.Errorf("answer %q, want one of %q", got, want)
			}
			e.judgeUpstream(t, c.forwarded, func(method, target string) bool {
				return method == s.method && target == s.path
			})
			checkForwardedTLS(t, e)
		})
	}
	t.Logf("%d of %d shapes mean the same in HTTP/2", ran, len(cases))
}

// sendH2 sends s as stream 1 and reads its answer: the status and problem
// code, or the stream's or connection's end when the server refuses it at
// the HTTP/2 layer ("RST_STREAM PROTOCOL_ERROR", "GOAWAY ...").
func sendH2(t *testing.T, h *rawH2, s h2Shape) string {
	t.Helper()
	h.buf.Reset()
	kv := append([]string{":method", s.method, ":scheme", "https", ":authority", s.authority, ":path", s.path}, s.fields...)
	for i := 0; i+1 < len(kv); i += 2 {
		_ = h.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	if err := h.f.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h.buf.Bytes(), EndHeaders: true, EndStream: s.body == "" && s.more == nil}); err != nil {
		t.Fatal(err)
	}
	if s.body != "" && !s.withhold {
		if err := h.f.WriteData(1, s.more == nil, []byte(s.body)); err != nil {
			t.Fatal(err)
		}
	}
	for i, d := range s.more {
		time.Sleep(100 * time.Millisecond)
		_ = h.f.WriteData(1, i == len(s.more)-1, []byte(d)) // the gate may have reset the stream
	}
	h.f.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var status, ctype string
	var body []byte
	_ = h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		fr, err := h.f.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				_ = h.f.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if fr.StreamID == 1 && status == "" {
				status = fr.PseudoValue("status")
				for _, f := range fr.RegularFields() {
					if f.Name == "content-type" {
						ctype = f.Value
					}
				}
			}
			if fr.StreamEnded() {
				return h2Answer(status, ctype, body)
			}
		case *http2.DataFrame:
			body = append(body, fr.Data()...)
			if fr.StreamEnded() {
				return h2Answer(status, ctype, body)
			}
		case *http2.RSTStreamFrame:
			return "RST_STREAM " + fr.ErrCode.String()
		case *http2.GoAwayFrame:
			return "GOAWAY " + fr.ErrCode.String()
		}
	}
}

// h2Answer is an answer as send reports it: the status, and the problem
// code when it is a problem.
func h2Answer(status, ctype string, body []byte) string {
	var prob struct{ Code string }
	if ctype == problem.ContentType && json.Unmarshal(body, &prob) == nil {
		status += " " + prob.Code
	}
	return status
}

// way is HTTP/2 by ALPN on the gate's TLS listener.
func (h tlsHostile) way() h2way {
	cfg := h.client.Clone()
	cfg.NextProtos = []string{"h2"}
	return h2way{
		opts:   ServerOptions{TLS: h.server, NoTLSLoops: h.noLoops},
		scheme: "https",
		dial: func(addr string) (net.Conn, error) {
			c, err := tls.Dial("tcp", addr, cfg)
			if err == nil && c.ConnectionState().NegotiatedProtocol != "h2" {
				c.Close()
				return nil, fmt.Errorf("ALPN chose %q, not h2", c.ConnectionState().NegotiatedProtocol)
			}
			return c, err
		},
		client: func() *http.Client {
			tr := &http.Transport{TLSClientConfig: h.client.Clone(), Protocols: new(http.Protocols)}
			tr.Protocols.SetHTTP2(true)
			return &http.Client{Transport: tr, Timeout: 20 * time.Second}
		},
	}
}

// TestH2TLSStreamsAreJudgedLikeHTTP1 is TestH2CStreamsAreJudgedLikeHTTP1
// over TLS: HTTP/2 by ALPN.
func TestH2TLSStreamsAreJudgedLikeHTTP1(t *testing.T) {
	for _, way := range tlsWays {
		h := newTLSHostile(t)
		h.noLoops = way.noLoops
		t.Run("loops"+way.name, func(t *testing.T) { testH2StreamsJudged(t, h.way()) })
	}
}

// TestHTTP2AbuseTLS is TestHTTP2Abuse over TLS: HTTP/2 by ALPN.
func TestHTTP2AbuseTLS(t *testing.T) {
	for _, way := range tlsWays {
		h := newTLSHostile(t)
		h.noLoops = way.noLoops
		t.Run("loops"+way.name, func(t *testing.T) { testHTTP2Abuse(t, h.way()) })
	}
}

// TestH2ContentLengthDisagreesWithStream: an HTTP/2 write whose DATA
// does not add up to its content-length is malformed (RFC 9113 §8.1.1),
// and an intermediary forwards no malformed request. net/http's server
// gives a stream that ended with its headers an empty body whatever its
// content-length, and resets one whose DATA goes past it only when that
// DATA arrives: without the gate's checks, each write below (a live token)
// reached the upstream as an empty or cut-short write, the last two while
// their clients got a reset. Well-formed writes still go through (over
// TLS, ALPN h2).
func TestH2ContentLengthDisagreesWithStream(t *testing.T) {
	h := newTLSHostile(t)
	for _, c := range []struct {
		name      string
		s         h2Shape
		forwarded int
	}{
		{"5 declared, stream ends with its headers", h2Shape{fields: []string{"content-length", "5"}}, 0},
		{"0 declared, DATA after", h2Shape{fields: []string{"content-length", "0"}, more: []string{"abc"}}, 0},
		{"3 declared, more DATA after them", h2Shape{fields: []string{"content-length", "3"}, body: "abc", more: []string{"de"}}, 0},
		{"3 declared, 3 sent, stream ends after", h2Shape{fields: []string{"content-length", "3"}, body: "abc", more: []string{""}}, 1},
		{"0 declared, stream ends with an empty DATA", h2Shape{fields: []string{"content-length", "0"}, more: []string{""}}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := h.env(t, false, "h2")
			conn, err := e.dial()
			if err != nil {
				t.Fatal(err)
			}
			s := c.s
			s.method, s.path, s.authority = "PUT", "/jobs/1", "gate"
			s.fields = append([]string{"fencing-token", "2"}, s.fields...)
			got := sendH2(t, newRawH2(t, conn), s)
			want := []string{"400 invalid-request", "400 invalid-body", "RST_STREAM PROTOCOL_ERROR"}
			if c.forwarded == 1 {
				want = []string{"200"}
			}
			if !slices.Contains(want, got) {
				t.Errorf("answer %q, want one of %q", got, want)
			}
			time.Sleep(50 * time.Millisecond) // a write forwarded after the answer would show
			e.judgeUpstream(t, c.forwarded, func(string, string) bool { return true })
		})
	}
}

// TestH2ContentLengthNotANumber: net/http's HTTP/2 server reads a
// content-length that is not a number as 0 and starts the handler before
// the body arrives (resetting the stream when DATA comes): the gate must
// not take that for a request without a body. A write so sent, even with
// a live token, never reaches the upstream. The body is withheld, so the
// gate answers before any DATA can reset the stream: without the check,
// the write is forwarded at once, body-less, every time.
func TestH2ContentLengthNotANumber(t *testing.T) {
	h := newTLSHostile(t)
	for _, cl := range []string{"+5", "5 ", "0x5", "5, 5", "-1", ""} {
		t.Run(strconv.Quote(cl), func(t *testing.T) {
			t.Parallel()
			e := h.env(t, false, "h2")
			conn, err := e.dial()
			if err != nil {
				t.Fatal(err)
			}
			got := sendH2(t, newRawH2(t, conn), h2Shape{method: "PUT", path: "/jobs/1", authority: "gate",
				fields: []string{"fencing-token", "2", "content-length", cl}, body: "hello", withhold: true})
			if got != "400 invalid-request" {
				t.Errorf("answer %q, want 400 invalid-request", got)
			}
			e.judgeUpstream(t, 0, func(string, string) bool { return true })
		})
	}
}
