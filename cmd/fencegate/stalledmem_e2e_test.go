//go:build linux

package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStalledBodiesWithinDeploymentMemory: the gate with the Kubernetes
// manifests' settings (FENCEGATE_MAX_CONNS=1000, GOMEMLIMIT=115MiB under a
// 128 MiB limit; deploy/kustomize_test.go keeps the manifests at most at
// that cap). Four client addresses each open 1,024 HTTP/1.1 connections,
// each a fenced write whose 16 KiB body (read whole before admission)
// stops one byte short: the connections past the cap are refused, and the
// gate's highest RSS stays under the limit. With the default cap (4,096)
// the same flood took it to 132 MiB.
func TestStalledBodiesWithinDeploymentMemory(t *testing.T) {
	const limit = 128 << 20
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer up.Close()
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + up.URL,
		"FENCEGATE_BODY_TIMEOUT=2m", "FENCEGATE_MAX_CONNS=1000", "GOMEMLIMIT=115MiB"}, "gate", "api")
	pid := p.cmd.Process.Pid
	code, lease, _ := call(t, "POST", p.url("api", "/v1/leases/r/acquire"), nil, `{"owner":"w","ttl_seconds":600}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, lease)
	}
	req := "PUT /jobs/r HTTP/1.1\r\nHost: g\r\nFencing-Token: " + fmt.Sprint(token(t, lease)) +
		"\r\nContent-Length: 16384\r\n\r\n" + strings.Repeat("b", 16<<10-1)
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var wg sync.WaitGroup
	for a := range 4 {
		ip := net.IPv4(127, 0, 1, byte(10+a))
		wg.Go(func() {
			for range 1024 {
				c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).Dial("tcp", p.addr["gate"])
				if err != nil {
					continue
				}
				_, _ = io.WriteString(c, req)
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// The gate holds its cap of connections (less the health checks'
	// reserve), then its RSS settles as the loops read the bodies in.
	deadline := time.Now().Add(20 * time.Second)
	for sample(scrape(t, p), "fencegate_connections", `listener="gate"`) < 900 {
		if time.Now().After(deadline) {
			t.Fatalf("the gate never held 900 connections:\n%s", scrape(t, p))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for last, steady := int64(0), 0; steady < 5 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		rss := procMemory(t, pid, "VmRSS")
		if rss > last {
			last, steady = rss, 0
		} else {
			steady++
		}
	}
	if hwm := procMemory(t, pid, "VmHWM"); hwm >= limit {
		t.Errorf("highest RSS %.1f MiB under 4,096 stalled connections capped at 1,000: at or past the deployment's %d MiB limit",
			float64(hwm)/(1<<20), limit>>20)
	} else {
		t.Logf("highest RSS %.1f MiB", float64(hwm)/(1<<20))
	}
}
