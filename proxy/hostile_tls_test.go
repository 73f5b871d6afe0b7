package proxy

import (
	"crypto/tls"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/certs/certstest"
)

// tlsHostile is a gate serving HTTPS (the general engine, as the binary
// serves FENCEGATE_PROXY_TLS_CERT) and the client side of its TLS.
type tlsHostile struct {
	server, client *tls.Config
}

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
	e := newHostileEnvWith(t, header, ServerOptions{HeaderTimeout: time.Second, TLS: h.server})
	cfg := h.client.Clone()
	cfg.NextProtos = protos
	e.dial = func() (net.Conn, error) {
		c, err := tls.Dial("tcp", e.gateAddr, cfg)
		if err == nil && len(protos) > 0 && c.ConnectionState().NegotiatedProtocol != protos[0] {
			c.Close()
			t.Fatalf("ALPN chose %q, want %q", c.ConnectionState().NegotiatedProtocol, protos[0])
		}
		return c, err
	}
	return e
}

// tlsHTTP1Answers are the shapes whose answer on the TLS listener differs
// from the cleartext one, and why. net/http's server refuses a head it
// cannot read with a canned plain-text answer before the gate sees the
// request; on a cleartext listener the gate rewrites it into a problem
// (canned.go), under TLS it cannot (the connection carries ciphertext), so
// the client reads net/http's own status without a problem code. Nothing
// is forwarded either way: the upstream's record is judged the same.
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
// record as on cleartext.
func TestHostileClientsTLS(t *testing.T) {
	h := newTLSHostile(t)
	cases := hostileCases()
	for name := range tlsHTTP1Answers {
		if !slices.ContainsFunc(cases, func(c hostileCase) bool { return c.name == name }) {
			t.Errorf("tlsHTTP1Answers names %q, which is no hostile shape", name)
		}
	}
	for _, c := range cases {
		want := c.want
		if w, ok := tlsHTTP1Answers[c.name]; ok {
			want = w
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := h.env(t, c.header, "http/1.1")
			e.judge(t, c.raw, want, c.forwarded)
		})
	}
}
