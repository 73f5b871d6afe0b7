package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
)

// TestLoopsSetting: FENCEGATE_LOOPS reaches the gate's event loops, and
// its default is one loop per CPU Go uses (GOMAXPROCS, set here so that
// the machine's own count does not matter); the binary logs the engine and
// loop count of each gate listener.
func TestLoopsSetting(t *testing.T) {
	for _, tc := range []struct {
		env   []string
		loops float64
	}{
		{[]string{"FENCEGATE_LOOPS=3", "GOMAXPROCS=2"}, 3},
		{[]string{"GOMAXPROCS=4"}, 4},
		{[]string{"GOMAXPROCS=1"}, 1},
	} {
		t.Run(strings.Join(tc.env, ","), func(t *testing.T) {
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
			if rec["engine"] != "event loops" || rec["loops"] != tc.loops || rec["addr"] != p.addr["gate"] {
				t.Fatalf("logged %v; want the event loops, %v of them, on %s", rec, tc.loops, p.addr["gate"])
			}
		})
	}
}
