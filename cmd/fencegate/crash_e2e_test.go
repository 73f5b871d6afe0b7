package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestKillMidStormKeepsLeasesAndMarks kills fencegate (SIGKILL) on the file
// store in the middle of a storm of acquisitions, fenced writes and
// releases, several times over the same file: every restart comes back
// without judging the file lost, with every lease a worker was granted
// (and did not release) still live with its token and every admitted
// write's mark kept (DESIGN §12: a crash is not a loss).
func TestKillMidStormKeepsLeasesAndMarks(t *testing.T) {
	if testing.Short() {
		t.Skip("short: restarts the binary several times")
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	dir := t.TempDir()
	// Writes in flight at a kill leave their barrier holds, which a restart
	// keeps (TestBarrierHoldsSurviveRestart) and later writes for those
	// resources wait out: a short upstream timeout and grace keep each
	// round's storm from waiting the defaults' 30 s (the upstream answers
	// at once, so no write here times out).
	env := []string{"FENCEGATE_UPSTREAM=" + upstream.URL, "FENCEGATE_AUDIT_LOG=off",
		"FENCEGATE_UPSTREAM_TIMEOUT=2s", "FENCEGATE_TIMEOUT_GRACE=1s"}

	var mu sync.Mutex
	live := map[string]int64{}  // resource -> the lease a worker holds, as granted
	marks := map[string]int64{} // resource -> highest token admitted
	for round := range 5 {
		p := start(t, dir, env, "api", "gate")
		if strings.Contains(p.logs.String(), "lost data") {
			t.Fatalf("round %d: restart judged the store file lost:\n%s", round, p.logs)
		}
		// Check what earlier rounds were told.
		for res, tok := range live {
			st, m, _ := call(t, "GET", p.url("api", "/v1/leases/"+res), nil, "")
			lease, _ := m["lease"].(map[string]any)
			if st != 200 || lease == nil || int64(lease["token"].(float64)) != tok {
				t.Fatalf("round %d: %s after kill -9: %d %v; want the live lease %d\n%s", round, res, st, m, tok, p.logs)
			}
		}
		for res, tok := range marks {
			st, m, _ := call(t, "GET", p.url("api", "/v1/leases/"+res), nil, "")
			if hw, _ := m["high_water_token"].(float64); st != 200 || int64(hw) < tok {
				t.Fatalf("round %d: %s after kill -9: %d %v; want the mark at least %d", round, res, st, m, tok)
			}
		}
		// The storm: each worker owns its resources, takes a lease (the
		// same owner takes a lease kept from an earlier round again),
		// writes through the gate, and releases two times in three.
		stop := make(chan struct{})
		granted := make(chan struct{}, 1<<12)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				client := &http.Client{}
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					res := fmt.Sprintf("storm:%d:%d", w, i%5)
					owner := "owner-" + res
					st, tok := acquireOnce(client, p.url("api", "/v1/leases/"+res+"/acquire"), owner)
					if st == 0 {
						return // killed
					}
					if st != 200 {
						continue
					}
					mu.Lock()
					live[res] = tok
					mu.Unlock()
					select {
					case granted <- struct{}{}:
					default:
					}
					req, _ := http.NewRequest("PUT", p.url("gate", "/jobs/"+res), strings.NewReader("x"))
					req.Header.Set("Fencing-Resource", res)
					req.Header.Set("Fencing-Token", fmt.Sprint(tok))
					if resp, err := client.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode == 200 {
							mu.Lock()
							marks[res] = max(marks[res], tok)
							mu.Unlock()
						}
					}
					if i%3 == 0 {
						continue // kept live across the kill
					}
					// Once the release is sent, whether the lease is still
					// live is unknown until its answer: not checked.
					mu.Lock()
					delete(live, res)
					mu.Unlock()
					resp, err := client.Post(p.url("api", "/v1/leases/"+res+"/release"), "application/json",
						strings.NewReader(fmt.Sprintf(`{"owner":%q,"token":%d}`, owner, tok)))
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}()
		}
		// Kill after a random number of granted leases, mid-storm.
		for range 40 + rand.IntN(120) {
			select {
			case <-granted:
			case <-p.exited:
				t.Fatalf("round %d: fencegate exited during the storm: %v\n%s", round, p.err, p.logs)
			}
		}
		_ = p.cmd.Process.Kill()
		<-p.exited
		close(stop)
		wg.Wait()
	}
	if len(live) == 0 || len(marks) == 0 {
		t.Fatalf("the storms left no live lease (%d) or mark (%d) to check", len(live), len(marks))
	}
}

// acquireOnce asks for a lease and returns the status (0 when no answer
// came: the process is gone) and the token granted.
func acquireOnce(client *http.Client, url, owner string) (int, int64) {
	resp, err := client.Post(url, "application/json", strings.NewReader(`{"owner":"`+owner+`","ttl_seconds":3600}`))
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	var l struct {
		Token int64 `json:"token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return 0, 0
	}
	return resp.StatusCode, l.Token
}
