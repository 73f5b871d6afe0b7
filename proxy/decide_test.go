package proxy

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// TestDecideTargets: how a write's own path and its Destination combine
// into the resources it is fenced on.
func TestDecideTargets(t *testing.T) {
	rules, err := ParseRules(`
		COPY,MOVE /b/{name}        fence b:{name}
		COPY,MOVE /a/{name}        fence strict a:{name}
		COPY,MOVE /same/{name}     fence same
		COPY,MOVE /open/{rest...}  pass
	`)
	if err != nil {
		t.Fatal(err)
	}
	up, _ := url.Parse("http://upstream:1")
	for _, header := range []bool{false, true} {
		g, err := New(Options{Upstream: up, Store: memstore.New(memstore.Options{}), Rules: rules, ResourceHeader: header})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			target, dest string
			verdict      Verdict
			want         []Target
		}{
			{"/b/1", "/a/2", Fence, []Target{{"a:2", 7, true}, {"b:1", 3, false}}}, // resource order, each its own token
			{"/a/1", "/b/2", Fence, []Target{{"a:1", 3, true}, {"b:2", 7, false}}},
			{"/same/1", "/same/2", Fence, []Target{{"same", 3, false}}}, // one resource, one token, one admission
			{"/open/x", "/b/2", Fence, []Target{{"b:2", 7, false}}},     // pass source, fenced destination
			{"/b/1", "/open/x", Fence, []Target{{"b:1", 3, false}}},
			{"/open/x", "/open/y", Forward, nil},
			{"/b/1", "/nowhere", Refuse, nil}, // the header never names a Destination's resource
			{"/b/1", "http://gate/a/2", Fence, []Target{{"a:2", 7, true}, {"b:1", 3, false}}},
			{"/b/1", "http://upstream:1/a/2", Fence, []Target{{"a:2", 7, true}, {"b:1", 3, false}}},
			{"/b/1", "http://other/a/2", Refuse, nil},
			{"/b/1", "/a/2?x", Refuse, nil},
		} {
			h := http.Header{HeaderToken: {"3"}, HeaderDestinationToken: {"7"}, HeaderResource: {"hdr"}, HeaderDestination: {c.dest}}
			d := g.decide(Incoming{Method: "COPY", Target: c.target, Host: "gate", Header: h})
			if d.Verdict != c.verdict || len(d.Targets) != len(c.want) {
				t.Errorf("header=%v COPY %s -> %s: %+v, want verdict %d targets %v", header, c.target, c.dest, d, c.verdict, c.want)
				continue
			}
			for i := range c.want {
				if d.Targets[i] != c.want[i] {
					t.Errorf("header=%v COPY %s -> %s: targets %v, want %v", header, c.target, c.dest, d.Targets, c.want)
				}
			}
			if want := fencing.Token(3); d.Verdict == Fence && strings.HasPrefix(c.target, "/open/") {
				want = 7 // only the destination is fenced
				if d.Token != want {
					t.Errorf("token %d, want %d", d.Token, want)
				}
			} else if d.Verdict == Fence && d.Token != want {
				t.Errorf("token %d, want %d", d.Token, want)
			}
		}
	}
}

// TestDestinationOrderedAtBarrier: a COPY whose Destination is X is
// registered at X's barrier too, so it does not overtake a lower-token
// write to X still in flight; and a COPY refused on its Destination never
// reaches the upstream, though its source admitted it.
func TestDestinationOrderedAtBarrier(t *testing.T) {
	e := newEnv(t, "PUT,COPY /files/{name} fence file:{name}", func(o *Options) { o.ResourceHeader = false })
	var mu sync.Mutex
	var events []string
	note := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }
	arrived, release := make(chan struct{}), make(chan struct{})
	e.up.handle = func(w http.ResponseWriter, r *http.Request, rec received) bool {
		note("arrive " + rec.Method)
		if rec.Method == "PUT" {
			close(arrived)
			<-release
		}
		note("done " + rec.Method)
		return false
	}
	for _, res := range []string{"file:X", "file:S"} {
		e.acquire(res, "old", time.Second)
	}
	e.clock.Advance(2 * time.Second)
	for _, res := range []string{"file:X", "file:S"} {
		if l := e.acquire(res, "new", 10*time.Second); l.Token != 2 {
			t.Fatalf("%s: token %d", res, l.Token)
		}
	}
	put := make(chan response, 1)
	go func() {
		r, _ := doReq(e.client, e.gateSrv.URL, "PUT", "/files/X", "one", HeaderToken, "1")
		put <- r
	}()
	<-arrived
	cp := make(chan response, 1)
	go func() {
		r, _ := doReq(e.client, e.gateSrv.URL, "COPY", "/files/S", "", HeaderToken, "2", HeaderDestination, "/files/X", HeaderDestinationToken, "2")
		cp <- r
	}()
	waitFor(t, "the COPY registered on both files", func() bool {
		return e.gate.registered("file:X", 2) == 1 && e.gate.registered("file:S", 2) == 1
	})
	close(release)
	if r := <-put; r.Status != 200 {
		t.Fatalf("PUT: %d %s", r.Status, r.Body)
	}
	if r := <-cp; r.Status != 200 {
		t.Fatalf("COPY: %d %s", r.Status, r.Body)
	}
	mu.Lock()
	got := strings.Join(events, ",")
	mu.Unlock()
	if got != "arrive PUT,done PUT,arrive COPY,done COPY" {
		t.Fatalf("upstream events %s", got)
	}

	// A stale holder's fresh lease on file:T (token 1) admits token 1
	// there, first in resource order; file:X, whose mark is 2, refuses
	// it: the COPY is refused and never forwarded. file:T's mark stays
	// raised to 1, the holder's own token there.
	e.acquire("file:T", "stale", 10*time.Second)
	r := e.do("COPY", "/files/T", "", HeaderToken, "1", HeaderDestination, "/files/X")
	wantProblem(t, r, 428, "token-required") // file:X's own token is missing
	if !strings.Contains(r.Problem["detail"].(string), HeaderDestinationToken) {
		t.Fatalf("detail %q does not name %s", r.Problem["detail"], HeaderDestinationToken)
	}
	r = e.do("COPY", "/files/T", "", HeaderToken, "1", HeaderDestination, "/files/X", HeaderDestinationToken, "1")
	wantProblem(t, r, 409, "stale-token")
	if r.Problem["resource"] != "file:X" {
		t.Fatalf("refusal names %v", r.Problem["resource"])
	}
	if n := e.up.count(); n != 2 {
		t.Fatalf("upstream got %d requests", n)
	}
	st, err := e.store.Status(context.Background(), "file:T")
	if err != nil || st.HighWater != 1 {
		t.Fatalf("file:T: %+v %v", st, err)
	}
}
