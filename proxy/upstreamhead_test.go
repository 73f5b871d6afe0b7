package proxy

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fencegate/fencegate/fencing/memstore"
)

// headerPool is what random client requests are made of: the fields the
// gate treats specially (hop-by-hop, replaced, User-Agent and Content-Type,
// cookies, the fencing headers), in several cases, and plain ones.
var headerPool = []string{
	"User-Agent", "user-agent", "Content-Type", "Cookie", "cookie", "Te", "TE", "Trailer",
	"Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Connection",
	"X-Forwarded-For", "x-forwarded-for", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded",
	"X-Request-Id", "Expect", HeaderToken, HeaderResource, "fencing-token", "Accept", "X-A", "x-a", "X-B",
	"Authorization", "Cache-Control", "If-Match",
}

var valuePool = []string{
	"1", "a=1", "b=2; c=3", "trailers", "trailers, deflate", "deflate", "keep-alive", "close",
	"X-A", "X-A, X-B", "Fencing-Token, X-B", "cookie", "user-agent", "Content-Type", "x-forwarded-for",
	"10.0.0.1", "text/plain", "", "  spaced  ", "Upgrade",
}

// TestUpstreamHeadAgrees: for random client heads, the event loops' head
// for the upstream (appendUpstreamHead, written in one pass) is the request
// the general engine sends (rewrite, through ReverseProxy and net/http's
// transport): the same method, target, Host and fields, value for value.
func TestUpstreamHeadAgrees(t *testing.T) {
	rules, err := ParseRules(testRules)
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{"http://up:8080", "http://up/base/?k=v"} {
		u, _ := url.Parse(base)
		g, err := New(Options{Upstream: u, Store: memstore.New(memstore.Options{}), Rules: rules})
		if err != nil {
			t.Fatal(err)
		}
		rec := &recordingTransport{}
		g.pooled.Transport = rec
		rapid.Check(t, func(t *rapid.T) {
			method := rapid.SampledFrom([]string{"GET", "HEAD", "PUT", "POST", "DELETE"}).Draw(t, "method")
			target := rapid.SampledFrom([]string{"/jobs/1", "/a?b=c", "/", "http://gate/x?y=1"}).Draw(t, "target")
			var raw strings.Builder
			raw.WriteString(method + " " + target + " HTTP/1.1\r\nHost: gate\r\n")
			for i, n := 0, rapid.IntRange(0, 12).Draw(t, "fields"); i < n; i++ {
				raw.WriteString(rapid.SampledFrom(headerPool).Draw(t, "name") + ": " + rapid.SampledFrom(valuePool).Draw(t, "value") + "\r\n")
			}
			body := rapid.IntRange(0, 3).Draw(t, "body")
			if body > 0 || rapid.Bool().Draw(t, "length") {
				raw.WriteString("Content-Length: " + strconv.Itoa(body) + "\r\n")
			}
			raw.WriteString("\r\n")
			c := loopRequest{remote: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 4000}}
			if err := c.parse([]byte(raw.String())); err != nil {
				t.Skip("h1 refuses it:", err) // the loops hand such heads off
			}
			x, _ := g.open(context.Background(), &c, nil, time.Now())
			loops, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(g.appendUpstreamHead(nil, x, body))))
			if err != nil {
				t.Fatalf("the loops' head does not parse: %v", err)
			}

			in, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw.String() + strings.Repeat("b", body))))
			if err != nil {
				t.Skip("net/http refuses it:", err)
			}
			in.RemoteAddr = "192.0.2.7:4000"
			w := httptest.NewRecorder()
			gx := &exchange{w: &answerWriter{ResponseWriter: w}, r: in, id: x.id, method: method}
			if body > 0 {
				b := []byte(strings.Repeat("b", body))
				gx.buffered = &b
			}
			rec.got = nil
			g.pooled.ServeHTTP(gx.w, in.WithContext(context.WithValue(in.Context(), exchangeKey{}, gx)))
			if rec.got == nil {
				t.Fatalf("the general engine sent nothing: %d %s", w.Code, w.Body)
			}
			general := rec.got
			if loops.Method != general.Method || loops.RequestURI != general.RequestURI || loops.Host != general.Host {
				t.Fatalf("client head:\n%q\nloops: %s %s Host %s\ngeneral: %s %s Host %s", raw.String(),
					loops.Method, loops.RequestURI, loops.Host, general.Method, general.RequestURI, general.Host)
			}
			if a, b := comparable(loops.Header), comparable(general.Header); !reflect.DeepEqual(a, b) {
				t.Fatalf("client head:\n%q\nloops send:\n%v\ngeneral engine sends:\n%v", raw.String(), a, b)
			}
		})
	}
}

// comparable is a request's header as both engines must agree on it:
// cookies as one list of pairs (the loops' parser drops empty ones), no Content-Length of 0 (equal to none).
func comparable(h http.Header) http.Header {
	h = h.Clone()
	if c := h["Cookie"]; len(c) > 0 {
		var pairs []string
		for _, v := range c {
			for p := range strings.SplitSeq(v, ";") {
				if p = strings.TrimSpace(p); p != "" {
					pairs = append(pairs, p)
				}
			}
		}
		delete(h, "Cookie")
		if len(pairs) > 0 {
			h["Cookie"] = []string{strings.Join(pairs, "; ")}
		}
	}
	if h.Get("Content-Length") == "0" {
		h.Del("Content-Length")
	}
	return h
}

// recordingTransport keeps the request it was last given, as the upstream
// would read it, and answers 204.
type recordingTransport struct{ got *http.Request }

func (rt *recordingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var buf bytes.Buffer
	if err := r.Write(&buf); err != nil {
		return nil, err
	}
	got, err := http.ReadRequest(bufio.NewReader(&buf))
	if err != nil {
		return nil, err
	}
	rt.got = got
	return &http.Response{StatusCode: 204, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}
