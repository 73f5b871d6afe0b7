package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestFencingHeadersSurviveConnection: a client that names the fencing
// headers in Connection (making them hop-by-hop) still gets them to the
// upstream unchanged, so an upstream that checks tokens itself can rely on
// them.
func TestFencingHeadersSurviveConnection(t *testing.T) {
	e := newEnv(t, "PUT /jobs/{id} fence job:{id}")
	l := e.acquire("job:1", "alice", time.Minute)
	r := e.do("PUT", "/jobs/1", "x", HeaderToken, tok(l.Token), HeaderResource, "job:1",
		"Connection", HeaderToken+", "+HeaderResource)
	if r.Status != http.StatusOK {
		t.Fatalf("write: %d %s", r.Status, r.Body)
	}
	got := e.up.requests()
	if len(got) != 1 || got[0].Token != tok(l.Token) || got[0].Resource != "job:1" {
		t.Fatalf("upstream received %+v; want both fencing headers unchanged", got)
	}
}

// TestRequestID: the gate adopts a client's X-Request-Id (or makes one),
// echoes it, and passes it to the upstream so their logs line up.
func TestRequestID(t *testing.T) {
	e := newEnv(t, "")
	l := e.acquire("job:1", "alice", time.Minute)
	r := e.do("PUT", "/x", "x", HeaderToken, tok(l.Token), HeaderResource, "job:1", "X-Request-Id", "req-42")
	if r.Status != http.StatusOK || r.Header.Get("X-Request-Id") != "req-42" {
		t.Fatalf("write: %d, echoed id %q", r.Status, r.Header.Get("X-Request-Id"))
	}
	if got := e.up.requests(); len(got) != 1 || got[0].Header.Get("X-Request-Id") != "req-42" {
		t.Fatalf("upstream did not get the request id: %+v", got)
	}
	r = e.do("PUT", "/x", "x", HeaderResource, "job:1") // refused: no token
	if r.Status != http.StatusPreconditionRequired || r.Header.Get("X-Request-Id") == "" {
		t.Fatalf("refusal: %d, echoed id %q", r.Status, r.Header.Get("X-Request-Id"))
	}
}

// TestRefusalNamesResourceAndToken: with route rules the resource comes
// from the path, so a refusal says which resource and token were checked.
func TestRefusalNamesResourceAndToken(t *testing.T) {
	e := newEnv(t, "PUT /jobs/{id} fence job:{id}")
	e.acquire("job:7", "alice", time.Minute)
	r := e.do("PUT", "/jobs/9", "x", HeaderToken, "1", HeaderResource, "job:7")
	wantProblem(t, r, http.StatusConflict, "token-not-issued")
	if r.Problem["resource"] != "job:9" || r.Problem["token"] != float64(1) || r.Problem["issued_token"] != float64(0) {
		t.Fatalf("refusal does not name what was checked: %s", r.Body)
	}
	if e.up.count() != 0 {
		t.Fatal("a refused write reached the upstream")
	}
}

// TestResponseRelayed: the client gets the service's status, headers
// (repeated ones, such as Set-Cookie, each kept; hop-by-hop ones dropped)
// and body, and a HEAD answer keeps the Content-Length of the GET.
func TestResponseRelayed(t *testing.T) {
	e := newEnv(t, testRules)
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		w.Header().Set("Content-Length", "5")
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "drop me")
		w.WriteHeader(http.StatusAccepted)
		if r.Method != http.MethodHead {
			_, _ = io.WriteString(w, "hello")
		}
		return true
	}
	for _, m := range []string{http.MethodHead, http.MethodGet} {
		req, _ := http.NewRequest(m, e.gateSrv.URL+"/x", nil)
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantBody := "hello"
		if m == http.MethodHead {
			wantBody = ""
		}
		if resp.StatusCode != http.StatusAccepted || resp.ContentLength != 5 || string(body) != wantBody ||
			strings.Join(resp.Header.Values("Set-Cookie"), ",") != "a=1,b=2" ||
			resp.Header.Get("Keep-Alive") != "" || resp.Header.Get("X-Hop") != "" || resp.Header.Get("X-Request-Id") == "" {
			t.Fatalf("%s: %d, Content-Length %d, body %q, header %v", m, resp.StatusCode, resp.ContentLength, body, resp.Header)
		}
	}
}

// TestUpstreamTarget: the upstream gets its base path and query joined
// with the path and query the client sent, byte for byte; an
// absolute-form read is reduced to its path.
func TestUpstreamTarget(t *testing.T) {
	for _, c := range []struct{ base, baseQuery, target, want string }{
		{"", "", "/jobs/7", "/jobs/7"},
		{"/base", "", "/jobs/7?y=2", "/base/jobs/7?y=2"},
		{"/base", "x=1", "/jobs/7?y=2", "/base/jobs/7?x=1&y=2"},
		{"/base", "x=1", "/jobs/7", "/base/jobs/7?x=1"},
		{"/base", "x=1", "/jobs/7?", "/base/jobs/7?x=1"},
		{"", "", "/a%2Fb;c?%5Fq", "/a%2Fb;c?%5Fq"},
		{"/base", "", "http://gate/x/y?z", "/base/x/y?z"},
		{"", "", "http://gate?z", "/?z"},
		{"", "", "http://gate", "/"},
	} {
		if got := string(upstreamTarget(c.base, c.baseQuery, []byte(c.target))); got != c.want {
			t.Errorf("upstreamTarget(%q, %q, %q) = %q, want %q", c.base, c.baseQuery, c.target, got, c.want)
		}
	}
}

// TestTrailersAreNotForwarded: a chunked write's trailers arrive after the
// gate decided, so none reaches the upstream, not even one naming a method
// override or a token.
func TestTrailersAreNotForwarded(t *testing.T) {
	e := newEnv(t, testRules, func(o *Options) { o.BodyBuffer = -1 })
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		if len(r.Trailer) != 0 || r.Header.Get("X-Http-Method-Override") != "" || len(r.Header.Values(HeaderToken)) != 1 {
			w.WriteHeader(http.StatusTeapot)
		}
		return false
	}
	l := e.acquire("job:1", "a", time.Minute)
	resp := rawExchange(t, e.gateSrv.Listener.Addr().String(), "PUT /jobs/1 HTTP/1.1\r\nHost: g\r\nFencing-Token: "+tok(l.Token)+
		"\r\nTrailer: X-HTTP-Method-Override, Fencing-Token\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"+
		"X-HTTP-Method-Override: DELETE\r\nFencing-Token: 999\r\n\r\n", false)
	if resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the upstream saw the trailers (or the write failed): %+v", resp)
	}
	if got := e.up.requests(); len(got) != 1 || got[0].Body != "abc" || got[0].Token != tok(l.Token) {
		t.Fatalf("upstream got %+v", got)
	}
}

// TestUpgradeNotSwitchedIsRelayed: when the upstream answers an allowed
// upgrade without switching protocols, the client gets that answer like
// any other: status and body, the request id, no hop-by-hop headers.
func TestUpgradeNotSwitchedIsRelayed(t *testing.T) {
	e := newEnv(t, "GET /ws upgrade websocket")
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "drop me")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, "no socket for you")
		return true
	}
	resp := rawExchange(t, e.gateSrv.Listener.Addr().String(), "GET /ws HTTP/1.1\r\nHost: g\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", false)
	if resp == nil {
		t.Fatal("no answer")
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusForbidden || string(body) != "no socket for you" ||
		resp.Header.Get("X-Hop") != "" || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("got %d %q, header %v", resp.StatusCode, body, resp.Header)
	}
}
