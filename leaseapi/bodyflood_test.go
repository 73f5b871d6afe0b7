package leaseapi_test

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/h2test"
	"github.com/fencegate/fencegate/leaseapi"
)

// The tests below flood the lease API with checkpoint calls of the largest
// body it accepts, each stalled one byte short of its end, and check that
// the bodies held stay within the body budget (bodybudget.go): the calls
// beyond it are answered 503 overloaded at once, the heap grows by the
// budget at most, and other clients keep being served.

// floodHeapSlack is what the heap may hold beyond the budget during a
// flood: the connections' own buffers and goroutines, client and server
// side (this process runs both), and the answers' garbage.
const floodHeapSlack = 8 << 20

// floodBody is a checkpoint call's body with a state of
// fencing.DefaultMaxCheckpointBytes (a JSON string): within the body limit,
// with no lease behind it (the body is read before the store is asked).
func floodBody() []byte {
	return []byte(`{"owner":"w","token":1,"state":"` + strings.Repeat("a", fencing.DefaultMaxCheckpointBytes-2) + `"}`)
}

// newFloodServer serves a lease API with the default body budget over a
// memory store, with ReadTimeout readTimeout (0: one that outlasts the
// test, which ends the stalled bodies itself).
func newFloodServer(t *testing.T, h2 bool, readTimeout time.Duration) (*leaseapi.Server, *httptest.Server) {
	t.Helper()
	api := leaseapi.NewServer(leaseapi.Options{Store: memstore.New(memstore.Options{})})
	srv := httptest.NewUnstartedServer(api)
	srv.Config.ReadTimeout = cmp.Or(readTimeout, 2*time.Minute)
	if h2 {
		srv.EnableHTTP2 = true
		srv.Config.HTTP2 = leaseapi.HTTP2Config()
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return api, srv
}

// loopback returns a dialer from 127.0.0.n: another client address on
// the same host, as the budget's share per client counts them.
func loopback(n byte) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, n)}, Timeout: 5 * time.Second}
}

// clientFrom is srv's client, dialling from 127.0.0.n on connections of
// its own.
func clientFrom(srv *httptest.Server, n byte) *http.Client {
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = loopback(n).DialContext
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// send sends a call with client c to the API at base; a body goes as
// JSON.
func send(t *testing.T, c *http.Client, base, method, path, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	return decodeAnswer(resp)
}

// liveHeap is the heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// stalledCall is one flood call: answered is closed once its answer came
// (status 0 when none could be read).
type stalledCall struct {
	finish   func() // sends the body's last byte
	answered chan struct{}
	ans      answer
}

func (c *stalledCall) done() bool {
	select {
	case <-c.answered:
		return true
	default:
		return false
	}
}

// stallHTTP1 sends a checkpoint call on a connection of its own from
// 127.0.0.from, all of body but its last byte, and reads its answer as
// soon as one comes.
func stallHTTP1(t *testing.T, addr string, from byte, path string, body []byte) *stalledCall {
	t.Helper()
	conn, err := loopback(from).Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &stalledCall{answered: make(chan struct{}), finish: func() { _, _ = conn.Write(body[len(body)-1:]) }}
	go func() {
		fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, len(body))
		_, _ = conn.Write(body[:len(body)-1]) // one shared slice: the client holds no copy
	}()
	go func() {
		defer close(c.answered)
		if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil {
			c.ans = decodeAnswer(resp)
			resp.Body.Close()
		}
	}()
	return c
}

// awaitFlood waits until every call but held was answered and the server
// holds held bodies of size bytes, and returns the calls still held.
func awaitFlood(t *testing.T, api *leaseapi.Server, calls []*stalledCall, held int, size int64) []*stalledCall {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // against a hang only
	for {
		var waiting []*stalledCall
		for _, c := range calls {
			if !c.done() {
				waiting = append(waiting, c)
			}
		}
		if len(waiting) == held && leaseapi.BodiesHeld(api) == int64(held)*size {
			return waiting
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls unanswered, %d body bytes held; want %d calls held, %d bytes",
				len(waiting), len(calls), leaseapi.BodiesHeld(api), held, int64(held)*size)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// awaitHeld waits until api holds n body bytes.
func awaitHeld(t *testing.T, api *leaseapi.Server, n int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); leaseapi.BodiesHeld(api) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // against a hang only
			t.Fatalf("%d body bytes held, want %d", leaseapi.BodiesHeld(api), n)
		}
	}
}

// wantOverloaded checks a refusal for the budget: 503 overloaded,
// problem+json, Retry-After.
func wantOverloaded(t *testing.T, what string, a answer) {
	t.Helper()
	wantProblem(t, what, a, http.StatusServiceUnavailable, "overloaded")
	if ra := a.header.Get("Retry-After"); ra != "1" {
		t.Fatalf("%s: Retry-After %q, want 1", what, ra)
	}
}

// finishAll sends the held calls' last bytes and waits for their answers:
// lease-lost (the flood holds no lease), and the budget all given back.
func finishAll(t *testing.T, api *leaseapi.Server, held []*stalledCall) {
	t.Helper()
	for _, c := range held {
		c.finish()
	}
	for _, c := range held {
		select {
		case <-c.answered:
		case <-time.After(30 * time.Second):
			t.Fatal("a held call was not answered after its last byte")
		}
		wantProblem(t, "a held call, finished", c.ans, http.StatusConflict, "lease-lost")
	}
	if n := leaseapi.BodiesHeld(api); n != 0 {
		t.Fatalf("%d body bytes still held after every call was answered", n)
	}
}

// TestCheckpointFloodHTTP1: 200 HTTP/1.1 connections from 8 addresses,
// each a checkpoint call of the largest body stalled before its last
// byte. The server holds as many bodies as its budget covers (7 in the
// default 8 MiB) and answers the 193 others 503 overloaded at once; the
// heap grows by the budget at most (it grew by 100 MiB for 100 such
// calls when every body was read whole without a budget). Meanwhile
// another client acquires and checkpoints a small state; its checkpoint
// of the largest state, which the budget cannot cover, is refused with
// nothing stored.
func TestCheckpointFloodHTTP1(t *testing.T) {
	const addrs, perAddr = 8, 25
	api, srv := newFloodServer(t, false, 0)
	total, perClient := leaseapi.BodyBudget(api)
	body := floodBody()
	size := int64(len(body))
	if perClient/size*addrs <= total/size {
		t.Fatalf("budget %d, %d per client: %d addresses do not fill it with bodies of %d bytes", total, perClient, addrs, size)
	}
	held := int(total / size) // every address could take more: the total binds

	base := liveHeap()
	var calls []*stalledCall
	for a := range addrs {
		for i := range perAddr {
			calls = append(calls, stallHTTP1(t, srv.Listener.Addr().String(), byte(1+a), fmt.Sprintf("/v1/leases/flood:%d:%d/checkpoint", a, i), body))
		}
	}
	stalled := awaitFlood(t, api, calls, held, size)
	grown := liveHeap() - base
	t.Logf("%d calls of %d bytes: %d held (%d bytes), heap grew by %.1f MiB (budget %.1f MiB)",
		len(calls), size, held, leaseapi.BodiesHeld(api), float64(grown)/(1<<20), float64(total)/(1<<20))
	if grown > total+floodHeapSlack {
		t.Errorf("the heap grew by %.1f MiB during the flood, past the body budget (%.1f MiB) and %d MiB of slack",
			float64(grown)/(1<<20), float64(total)/(1<<20), floodHeapSlack>>20)
	}
	for _, c := range calls {
		if c.done() {
			wantOverloaded(t, "a flood call beyond the budget", c.ans)
		}
	}

	// Another client, during the flood.
	other := clientFrom(srv, 9)
	do := func(method, path, body string) answer { return send(t, other, srv.URL, method, path, body) }
	lease := do("POST", "/v1/leases/job:9/acquire", `{"owner":"w9","ttl_seconds":60}`)
	wantOK(t, "another client's acquire during the flood", lease)
	token := lease.num("token")
	big := fmt.Sprintf(`{"owner":"w9","token":%d,"state":"%s"}`, token, strings.Repeat("b", fencing.DefaultMaxCheckpointBytes-2))
	wantOverloaded(t, "a checkpoint the budget cannot cover", do("PUT", "/v1/leases/job:9/checkpoint", big))
	st := do("GET", "/v1/leases/job:9", "")
	if st.obj("checkpoint") != nil || st.obj("lease") == nil || st.obj("lease")["expires_at"] != lease.str("expires_at") {
		t.Fatalf("the refused checkpoint changed the resource: %s", st.raw)
	}
	wantOK(t, "another client's small checkpoint during the flood",
		do("PUT", "/v1/leases/job:9/checkpoint", fmt.Sprintf(`{"owner":"w9","token":%d,"state":{"done":1}}`, token)))

	finishAll(t, api, stalled)
}

// TestCheckpointFloodHTTP2: one HTTP/2 connection (TLS, ALPN) carries 100
// checkpoint streams of the largest body, each stalled before its last
// byte. Its client address holds its share of the budget (3 bodies in
// its 4 MiB); the other streams are answered 503 overloaded at once
// (one connection held 165 MiB of heap so before the budget). Another
// client checkpoints a state of the largest size meanwhile.
func TestCheckpointFloodHTTP2(t *testing.T) {
	const streams = 100
	api, srv := newFloodServer(t, true, 0)
	total, perClient := leaseapi.BodyBudget(api)
	body := floodBody()
	size := int64(len(body))
	held := int(perClient / size)

	hc := clientFrom(srv, 1)
	hc.Timeout = 0 // the held calls are answered when the test finishes them
	tr := hc.Transport.(*http.Transport)
	var dials atomic.Int32
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return loopback(1).DialContext(ctx, network, addr)
	}
	defer tr.CloseIdleConnections()
	warm, err := hc.Get(srv.URL + "/livez")
	if err != nil || warm.ProtoMajor != 2 {
		t.Fatalf("warm-up: %v %v", err, warm)
	}
	io.Copy(io.Discard, warm.Body)
	warm.Body.Close()

	base := liveHeap()
	var calls []*stalledCall
	for i := range streams {
		pr, pw := io.Pipe()
		c := &stalledCall{answered: make(chan struct{}), finish: func() {
			_, _ = pw.Write(body[len(body)-1:])
			pw.Close()
		}}
		calls = append(calls, c)
		t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF) }) // a test that fails leaves no stream behind
		go func() { _, _ = pw.Write(body[:len(body)-1]) }()          // ends when the stream does
		go func() {
			defer close(c.answered)
			req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/v1/leases/flood:%d/checkpoint", srv.URL, i), pr)
			req.ContentLength = size
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				pr.CloseWithError(err)
				return
			}
			defer resp.Body.Close()
			if resp.ProtoMajor == 2 {
				c.ans = decodeAnswer(resp)
			}
		}()
	}
	stalled := awaitFlood(t, api, calls, held, size)
	grown := liveHeap() - base
	t.Logf("%d streams of %d bytes on %d connection(s): %d held (%d bytes), heap grew by %.1f MiB (budget %.1f MiB, %.1f MiB per client)",
		streams, size, dials.Load(), held, leaseapi.BodiesHeld(api), float64(grown)/(1<<20), float64(total)/(1<<20), float64(perClient)/(1<<20))
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections dialled, want the one", n)
	}
	if grown > total+floodHeapSlack {
		t.Errorf("the heap grew by %.1f MiB during the flood, past the body budget (%.1f MiB) and %d MiB of slack",
			float64(grown)/(1<<20), float64(total)/(1<<20), floodHeapSlack>>20)
	}
	for _, c := range calls {
		if c.done() {
			wantOverloaded(t, "a stream beyond the client's share", c.ans)
		}
	}

	// Another client, during the flood: a checkpoint of the largest state.
	other := clientFrom(srv, 2)
	do := func(method, path, body string) answer { return send(t, other, srv.URL, method, path, body) }
	lease := do("POST", "/v1/leases/job:2/acquire", `{"owner":"w2"}`)
	wantOK(t, "another client's acquire during the flood", lease)
	big := fmt.Sprintf(`{"owner":"w2","token":%d,"state":"%s"}`, lease.num("token"), strings.Repeat("b", fencing.DefaultMaxCheckpointBytes-2))
	wantOK(t, "another client's largest checkpoint during the flood", do("PUT", "/v1/leases/job:2/checkpoint", big))
	if st := do("GET", "/v1/leases/job:2", ""); st.obj("checkpoint") == nil {
		t.Fatalf("no checkpoint after it was accepted: %s", st.raw)
	}

	finishAll(t, api, stalled)
}

// TestStalledBodyGivesBackItsBudget: a body that stops arriving is cut off
// by the server's ReadTimeout (FENCEGATE_BODY_TIMEOUT's part of it in
// fencegate), over HTTP/1.1 and per stream over HTTP/2, and its part of
// the budget is given back: a client cannot keep the budget by stalling.
func TestStalledBodyGivesBackItsBudget(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP1", true: "HTTP2"}[h2], func(t *testing.T) {
			api, srv := newFloodServer(t, h2, 300*time.Millisecond) // provokes the cut; not a bound under test
			body := floodBody()
			var c *stalledCall
			if h2 {
				pr, pw := io.Pipe()
				t.Cleanup(func() { pw.Close() })
				go func() { _, _ = pw.Write(body[:len(body)-1]) }()
				c = &stalledCall{answered: make(chan struct{})}
				go func() {
					defer close(c.answered)
					req, _ := http.NewRequest("PUT", srv.URL+"/v1/leases/job:1/checkpoint", pr)
					req.ContentLength = int64(len(body))
					req.Header.Set("Content-Type", "application/json")
					if resp, err := srv.Client().Do(req); err == nil && resp.ProtoMajor == 2 {
						c.ans = decodeAnswer(resp)
						resp.Body.Close()
					}
				}()
			} else {
				c = stallHTTP1(t, srv.Listener.Addr().String(), 1, "/v1/leases/job:1/checkpoint", body)
			}
			select {
			case <-c.answered:
			case <-time.After(30 * time.Second):
				t.Fatal("a stalled body was not cut off")
			}
			// The answer may be lost to a reset, over HTTP/1.1, when the
			// connection closes with bytes of the body still in flight.
			if c.ans.status != 0 || h2 {
				wantProblem(t, "a stalled body", c.ans, http.StatusBadRequest, "invalid-json")
				if !strings.Contains(c.ans.str("detail"), "could not be read") {
					t.Fatalf("detail %q, want it to say the body could not be read", c.ans.str("detail"))
				}
			}
			awaitHeld(t, api, 0)
		})
	}
}

// TestHTTP2ConfigBoundsStreamsAndWindows: a server with HTTP2Config
// announces what it promises: 128 streams a connection, a receive window
// of 64 KiB a stream and 256 KiB a connection (net/http's default is
// 1 MiB each), frames of 16 KiB.
func TestHTTP2ConfigBoundsStreamsAndWindows(t *testing.T) {
	_, srv := newFloodServer(t, true, 0)
	conn, err := tls.Dial("tcp", srv.Listener.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN chose %q", p)
	}
	settings, connWindow, err := h2test.ServerSettings(conn, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := map[http2.SettingID]uint32{
		http2.SettingMaxConcurrentStreams: leaseapi.MaxConcurrentStreams,
		http2.SettingInitialWindowSize:    64 << 10,
		http2.SettingMaxFrameSize:         16 << 10,
	}
	for id, v := range want {
		if settings[id] != v {
			t.Errorf("%v = %d, want %d (all: %v)", id, settings[id], v, settings)
		}
	}
	if connWindow != 256<<10 {
		t.Errorf("connection receive window %d, want %d", connWindow, 256<<10)
	}
}

// TestLeaseCallsGoOnBesideTheirAddressLargeBodies: on the default
// loopback listener every worker is one address. Large checkpoint bodies
// stalled from it take its share but an eighth, which stays for the small
// calls that keep leases alive: the same address's acquire goes through.
func TestLeaseCallsGoOnBesideTheirAddressLargeBodies(t *testing.T) {
	api, srv := newFloodServer(t, false, 0)
	_, perClient := leaseapi.BodyBudget(api)
	body := []byte(strings.Repeat("x", 1<<20))
	var held []*stalledCall
	for i := range 4 {
		held = append(held, stallHTTP1(t, srv.Listener.Addr().String(), 1, fmt.Sprintf("/v1/leases/big:%d/checkpoint", i), body))
	}
	awaitHeld(t, api, perClient/int64(len(body))*int64(len(body)))
	c := clientFrom(srv, 1)
	a := send(t, c, srv.URL, "POST", "/v1/leases/job:1/acquire", `{"owner":"w","ttl_seconds":60}`)
	if a.status != http.StatusOK {
		t.Errorf("a 40-byte acquire from the same address while large bodies stall: %d %s; want 200", a.status, a.raw)
	}
	_ = held
}

// TestChunkedLeaseCallsUseTheReserve: a lease call without a
// Content-Length (chunked) reserves a small body's bytes first, and so
// goes through on the reserve while large bodies from other addresses
// hold all the rest.
func TestChunkedLeaseCallsUseTheReserve(t *testing.T) {
	api, srv := newFloodServer(t, false, 0)
	total, _ := leaseapi.BodyBudget(api)
	body := floodBody()
	size := int64(len(body))
	n := int(total / size)
	for i := range n {
		stallHTTP1(t, srv.Listener.Addr().String(), byte(2+i/3), fmt.Sprintf("/v1/leases/big:%d/checkpoint", i), body)
	}
	rest := total - int64(n)*size - 100 // the rest of the large bodies' room, but 100 bytes
	stallHTTP1(t, srv.Listener.Addr().String(), 10, "/v1/leases/big:x/checkpoint", []byte(strings.Repeat("x", int(rest))))
	awaitHeld(t, api, int64(n)*size+rest)
	c := clientFrom(srv, 20)
	if a := send(t, c, srv.URL, "POST", "/v1/leases/job:2/acquire", `{"owner":"w","ttl_seconds":60}`); a.status != http.StatusOK {
		t.Fatalf("with Content-Length: %d", a.status)
	}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/leases/job:1/acquire", struct{ *strings.Reader }{strings.NewReader(`{"owner":"w","ttl_seconds":60}`)}) // unknown length: chunked
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a chunked 30-byte acquire from a fresh address: %d; want 200: the reserve for small calls is free", resp.StatusCode)
	}
}
