package proxy

import (
	"bufio"
	"bytes"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"pgregory.net/rapid"

	"github.com/fencegate/fencegate/fencing/memstore"
)

// headerPool is what random client requests are made of: the fields the
// gate treats specially (hop-by-hop, replaced, the fasthttp special ones,
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
// for the upstream (appendUpstreamHead, written in one pass) is byte for
// byte what the fasthttp engine sends (upstreamRequest's header written
// by fasthttp with the body's Content-Length).
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
			var c fasthttp.RequestCtx
			c.Init2(nil, nil, false)
			c.SetRemoteAddr(&net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 4000})
			if err := c.Request.Header.Read(bufio.NewReader(strings.NewReader(raw.String()))); err != nil {
				t.Skip("fasthttp refuses it:", err) // the loops hand such heads off
			}
			x, _ := g.open(&c, nil, time.Now())
			got := g.appendUpstreamHead(nil, x, body)

			out := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(out)
			g.upstreamRequest(x, out, false)
			if h := &out.Header; body > 0 || !h.IsGet() && !h.IsHead() {
				h.SetContentLength(body)
			}
			want := out.Header.AppendBytes(nil)
			if !bytes.Equal(got, want) {
				t.Fatalf("client head:\n%q\nevent loops send:\n%q\nfasthttp sends:\n%q", raw.String(), got, want)
			}
		})
	}
}
