package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLoopsSetting: FENCEGATE_LOOPS reaches the gate's event loops, and
// its default is one loop per CPU Go uses (GOMAXPROCS, set here so that
// the machine's own count does not matter); the binary logs the engine, the
// loop count and GOMAXPROCS of each gate listener. With GOMAXPROCS unset,
// Go gets one processor more than the loops when they would hold them all
// (FENCEGATE_SPARE_PROCESSOR), not otherwise: N loops on fewer CPUs run
// with N+1, and with the switch off Go keeps its own count, one per CPU at
// most; a GOMAXPROCS the operator sets is kept.
func TestLoopsSetting(t *testing.T) {
	many := runtime.NumCPU() + 1 // more loops than Go's default processors
	is := func(want float64) func(procs, loops float64) bool {
		return func(procs, _ float64) bool { return procs == want }
	}
	for _, tc := range []struct {
		env        []string
		loops      float64 // 0: any count
		gomaxprocs func(procs, loops float64) bool
	}{
		{[]string{"FENCEGATE_LOOPS=3", "GOMAXPROCS=2"}, 3, is(2)},
		{[]string{"GOMAXPROCS=4"}, 4, is(4)},
		{[]string{"GOMAXPROCS=1"}, 1, is(1)},
		{[]string{"FENCEGATE_LOOPS=" + strconv.Itoa(many)}, float64(many), is(float64(many + 1))},
		{[]string{"FENCEGATE_LOOPS=" + strconv.Itoa(many), "FENCEGATE_SPARE_PROCESSOR=false"}, float64(many),
			func(procs, _ float64) bool { return procs >= 1 && procs <= float64(runtime.NumCPU()) }},
		// The defaults: a loop per CPU Go uses, and one processor more.
		{nil, 0, func(procs, loops float64) bool { return procs == loops+1 }},
	} {
		t.Run(cmp.Or(strings.Join(tc.env, ","), "defaults"), func(t *testing.T) {
			p := start(t, t.TempDir(), append([]string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=http://127.0.0.1:1"}, tc.env...), "api", "gate")
			p.waitLog(`"msg":"gate engine"`, 1)
			var rec map[string]any
			sc := bufio.NewScanner(strings.NewReader(p.logs.String()))
			for sc.Scan() {
				var r map[string]any
				if json.Unmarshal(sc.Bytes(), &r) == nil && r["msg"] == "gate engine" {
					rec = r
				}
			}
			loops, _ := rec["loops"].(float64)
			procs, _ := rec["gomaxprocs"].(float64)
			if rec["engine"] != "event loops" || loops < 1 || tc.loops != 0 && loops != tc.loops || rec["addr"] != p.addr["gate"] {
				t.Fatalf("logged %v; want the event loops, %v of them, on %s", rec, tc.loops, p.addr["gate"])
			}
			if !tc.gomaxprocs(procs, loops) {
				t.Fatalf("logged %v: GOMAXPROCS %v with %v loops is not what %q asks for", rec, procs, loops, tc.env)
			}
		})
	}
}

// TestUpstreamConnsSharedByLoops: with FENCEGATE_UPSTREAM_CONNS=1 and two
// event loops, fenced writes on two client connections (one on each loop,
// as accepted connections go round) take turns on the one upstream
// connection: each is applied by the upstream, none waits for the other
// loop's idle connection to time out.
func TestUpstreamConnsSharedByLoops(t *testing.T) {
	rec := &recorder{}
	upstream := httptest.NewServer(rec)
	defer upstream.Close()
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:",
		"FENCEGATE_UPSTREAM=" + upstream.URL,
		"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}",
		"FENCEGATE_UPSTREAM_CONNS=1",
		"FENCEGATE_LOOPS=2",
	}, "api", "gate")
	st, lease, _ := call(t, "POST", p.url("api", "/v1/leases/job:9/acquire"), nil, `{"owner":"w","ttl_seconds":60}`)
	if st != 200 {
		t.Fatalf("acquire: %d %v", st, lease)
	}
	tok := strconv.FormatInt(token(t, lease), 10)
	var conns [2]net.Conn
	var readers [2]*bufio.Reader
	for i := range conns {
		c, err := net.Dial("tcp", p.addr["gate"])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i], readers[i] = c, bufio.NewReader(c)
	}
	var want []string
	for turn := range 4 {
		i := turn % 2
		body := fmt.Sprintf(`{"turn":%d}`, turn)
		c := conns[i]
		if err := c.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
			t.Fatal(err)
		}
		req := fmt.Sprintf("PUT /jobs/9 HTTP/1.1\r\nHost: gate\r\nFencing-Token: %s\r\nContent-Length: %d\r\n\r\n%s", tok, len(body), body)
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(readers[i], nil)
		if err != nil {
			t.Fatalf("turn %d on client connection %d: %v (waiting for the upstream connection the other loop keeps?)", turn, i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("turn %d on client connection %d: %d", turn, i, resp.StatusCode)
		}
		want = append(want, "PUT /jobs/9 token="+tok+" body="+body)
	}
	if got := rec.list(); !slices.Equal(got, want) {
		t.Fatalf("the upstream received %q, want %q", got, want)
	}
}
