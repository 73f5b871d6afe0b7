package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/internal/syncbuf"
	"github.com/fencegate/fencegate/internal/tiedproc"
	"github.com/fencegate/fencegate/leaseapi"
)

// bgProc is a fencegate binary running in the background.
type bgProc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr *syncbuf.Buffer
	exited         chan struct{} // closed when the process has exited
}

// startBG starts the binary with args and env (plus PATH) and stops it in
// cleanup if it still runs.
func startBG(t *testing.T, env []string, args ...string) *bgProc {
	t.Helper()
	return runBG(t, env, exec.Command(binary, args...))
}

// runBG starts cmd (the binary, or a command that runs it) as startBG
// does.
func runBG(t *testing.T, env []string, cmd *exec.Cmd) *bgProc {
	t.Helper()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Dir = t.TempDir()
	// A command left behind by a failed test may hold the output pipes:
	// do not wait for them long after the process exited.
	cmd.WaitDelay = 5 * time.Second
	b := &bgProc{t: t, cmd: cmd, stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = b.stdout, b.stderr
	if err := tiedproc.Start(cmd, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		close(b.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-b.exited:
		default:
			_ = cmd.Process.Kill()
			<-b.exited
		}
	})
	return b
}

// wait waits up to d for the process to exit and returns its exit status.
func (b *bgProc) wait(d time.Duration) int {
	b.t.Helper()
	select {
	case <-b.exited:
		return b.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		b.t.Fatalf("%v did not exit within %v\nstdout %s\nstderr %s", b.cmd.Args[1:], d, b.stdout, b.stderr)
		return 0
	}
}

// startDemoUpstream runs `fencegate demo-upstream` on a free port and
// returns its base URL.
func startDemoUpstream(t *testing.T) string {
	t.Helper()
	b := startBG(t, nil, "demo-upstream", "127.0.0.1:0")
	limit := time.Now().Add(30 * time.Second)
	for time.Now().Before(limit) {
		sc := bufio.NewScanner(strings.NewReader(b.stderr.String()))
		for sc.Scan() {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "demo upstream listening" {
				return "http://" + rec.Addr
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the demo upstream did not start: %s", b.stderr)
	return ""
}

// waitFile waits until path exists.
func waitFile(t *testing.T, path string, d time.Duration, b *bgProc) {
	t.Helper()
	limit := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("%s did not appear within %v\nstdout %s\nstderr %s", filepath.Base(path), d, b.stdout, b.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// processGone reports whether pid has exited (a zombie counts as gone).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

// TestRunKeepsTheLeaseAndGivesTheCommandItsEnvironment: a command that
// runs for three times its TTL keeps the lease, renewed all along; it sees
// the lease in its environment; the lease is released, finished, when it
// exits 0.
func TestRunKeepsTheLeaseAndGivesTheCommandItsEnvironment(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	api := p.url("api", "")
	client := leaseapi.NewClient(api)
	ctx := context.Background()
	d := t.TempDir()
	script := `env | grep -E '^(FENCING_[A-Z]+|FENCEGATE_API_URL)=' | sort > "$D/env"; touch "$D/started"
while [ ! -e "$D/stop" ]; do sleep 0.05; done`
	r := startBG(t, []string{"FENCEGATE_API_URL=" + api, "D=" + d}, "run", "--resource", "job:keep", "--ttl", "3s", "--finish-on-success", "--", "sh", "-c", script)
	waitFile(t, filepath.Join(d, "started"), 30*time.Second, r)

	st, err := client.Status(ctx, "job:keep")
	if err != nil || st.Lease == nil {
		t.Fatalf("status while the command runs: %+v, %v", st, err)
	}
	first := *st.Lease
	host, _ := os.Hostname()
	wantEnv := strings.Join([]string{
		"FENCEGATE_API_URL=" + api,
		"FENCING_OWNER=" + host + ":" + strconv.Itoa(r.cmd.Process.Pid) + ":" + "[0-9a-f]{8}",
		"FENCING_RESOURCE=job:keep",
		"FENCING_TOKEN=" + first.Token.String(),
	}, "\n")
	if got := readFile(t, filepath.Join(d, "env")); !regexp.MustCompile("^"+wantEnv+"$").MatchString(got) || first.Owner != got[strings.Index(got, "FENCING_OWNER=")+len("FENCING_OWNER="):strings.Index(got, "\nFENCING_RESOURCE")] {
		t.Fatalf("the command's environment:\n%s\nwant (the owner host:pid:random, the lease's):\n%s\nlease owner %s", got, wantEnv, first.Owner)
	}

	// For three TTLs the lease stays live with the same token, its expiry
	// moving forward with every renewal.
	expiries := map[time.Time]bool{}
	for end := time.Now().Add(3 * first.TTL); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		st, err := client.Status(ctx, "job:keep")
		if err != nil || st.Lease == nil || st.Lease.Token != first.Token || st.Lease.Owner != first.Owner {
			t.Fatalf("status while the command runs: %+v, %v\nrun's stderr: %s", st, err, r.stderr)
		}
		expiries[st.Lease.ExpiresAt] = true
	}
	if len(expiries) < 3 {
		t.Fatalf("the lease's expiry moved %d times in 3 TTLs", len(expiries)-1)
	}

	if err := os.WriteFile(filepath.Join(d, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(30 * time.Second); code != 0 {
		t.Fatalf("run exited %d, want the command's 0\n%s", code, r.stderr)
	}
	st, err = client.Status(ctx, "job:keep")
	if err != nil || st.Lease != nil || st.Previous == nil || *st.Previous != (fencing.Previous{Owner: first.Owner, Token: first.Token, Ended: fencing.EndReleased, Finished: true}) {
		t.Fatalf("status after the command exited 0: %+v %+v, %v", st, st.Previous, err)
	}
}

// TestRunExitStatuses: the command's own status, 127 when it cannot start,
// 75 when the lease stays held by another owner; the lease is released
// (not finished) after a failure.
func TestRunExitStatuses(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	api := p.url("api", "")
	client := leaseapi.NewClient(api)
	ctx := context.Background()
	env := []string{"FENCEGATE_API_URL=" + api}

	r := fg(t, env, "", "run", "--resource", "job:fail", "--finish-on-success", "--", "sh", "-c", "exit 3")
	if r.code != 3 {
		t.Fatalf("run of a command exiting 3: %d\n%s", r.code, r.stderr)
	}
	if st, err := client.Status(ctx, "job:fail"); err != nil || st.Lease != nil || st.Previous == nil || st.Previous.Ended != fencing.EndReleased || st.Previous.Finished {
		t.Fatalf("status after a failed command: %+v, %v", st, err)
	}
	r = fg(t, env, "", "run", "--resource", "job:sig", "--", "sh", "-c", "kill -KILL $$")
	if r.code != 128+int(syscall.SIGKILL) {
		t.Fatalf("run of a command killed by SIGKILL: %d, want %d", r.code, 128+int(syscall.SIGKILL))
	}
	r = fg(t, env, "", "run", "--resource", "job:none", "--", "/nonexistent/command")
	if r.code != 127 || !strings.Contains(r.stderr, "/nonexistent/command") {
		t.Fatalf("run of a missing command: %d %q", r.code, r.stderr)
	}
	// One lease taken and ended: the last issued token is the ended one's.
	if st, err := client.Status(ctx, "job:none"); err != nil || st.Lease != nil || st.Previous == nil || st.Issued != st.Previous.Token {
		t.Fatalf("status after a missing command: %+v, %v", st, err)
	}

	if _, err := client.Acquire(ctx, "job:held", leaseapi.AcquireOptions{Owner: "other", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	d := t.TempDir()
	r = fg(t, append(env, "D="+d), "", "run", "--resource", "job:held", "--wait", "1s", "--", "sh", "-c", `touch "$D/ran"`)
	if r.code != exitNotAcquired || r.afterWait(t).problem(t)["code"] != "lease-held" {
		t.Fatalf("run on a held lease: %d %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(d, "ran")); err == nil {
		t.Fatal("the command ran without the lease")
	}

	// Waiting out another owner's lease uses up part of the local
	// deadline, which counts from the sending of the acquire request: run
	// renews before starting the command, and the command runs.
	other, err := client.Acquire(ctx, "job:wait", leaseapi.AcquireOptions{Owner: "other", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r = fg(t, append(env, "D="+d), "", "run", "--resource", "job:wait", "--ttl", "3s", "--wait", "10s", "--", "sh", "-c", `touch "$D/waited"`)
	if r.code != 0 {
		t.Fatalf("run after waiting for the lease: %d %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(d, "waited")); err != nil {
		t.Fatal("the command did not run after the wait")
	}
	if st, err := client.Status(ctx, "job:wait"); err != nil || st.Previous == nil || st.Previous.Token <= other.Token || st.Previous.Ended != fencing.EndReleased {
		t.Fatalf("status after waiting for the lease: %+v, %v", st, err)
	}
}

// TestRunForwardsSignals: SIGTERM, SIGINT, SIGHUP (a closed terminal or
// ssh session) and SIGQUIT to fencegate run reach the command and its
// children (its process group), and the lease is released; none of them
// ends fencegate run alone with the command running on. SIGTSTP (Ctrl-Z)
// is ignored: a stopped fencegate run could not renew the lease.
func TestRunForwardsSignals(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	api := p.url("api", "")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			d := t.TempDir()
			name := strings.TrimPrefix(unix.SignalName(sig), "SIG")
			resource := "job:" + strings.ToLower(name)
			script := `sleep 300 & echo $! > "$D/grandchild"
trap 'echo got > "$D/got"; exit 0' ` + name + `
touch "$D/started"
while :; do sleep 0.05; done`
			r := startBG(t, []string{"FENCEGATE_API_URL=" + api, "D=" + d}, "run", "--resource", resource, "--ttl", "5s", "--", "sh", "-c", script)
			waitFile(t, filepath.Join(d, "started"), 30*time.Second, r)
			grandchild, err := strconv.Atoi(readFile(t, filepath.Join(d, "grandchild")))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(grandchild, syscall.SIGKILL) })
			if sig == syscall.SIGTERM {
				// Ctrl-Z first: ignored, fencegate run goes on.
				if err := r.cmd.Process.Signal(syscall.SIGTSTP); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			// A shell's background jobs ignore SIGINT and SIGQUIT (POSIX):
			// the group gets them, but they do not end its sleep, which
			// would keep the command's output open.
			ignored := sig == syscall.SIGINT || sig == syscall.SIGQUIT
			if ignored {
				_ = syscall.Kill(grandchild, syscall.SIGKILL)
			}
			if code := r.wait(30 * time.Second); code != 0 {
				t.Fatalf("run exited %d, want the command's 0 (it traps %v)\n%s", code, sig, r.stderr)
			}
			if readFile(t, filepath.Join(d, "got")) != "got" {
				t.Fatalf("the command did not get %v", sig)
			}
			for limit := time.Now().Add(10 * time.Second); !ignored && !processGone(grandchild); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(limit) {
					t.Fatalf("the command's child did not get %v", sig)
				}
			}
			st, err := leaseapi.NewClient(api).Status(context.Background(), resource)
			if err != nil || st.Lease != nil || st.Previous == nil || st.Previous.Ended != fencing.EndReleased {
				t.Fatalf("status after %v: %+v, %v", sig, st, err)
			}
		})
	}
}

// TestRunKillsACommandThatOutlivesItsLostLease: when a renewal is refused
// (the lease was released behind run's back), the command gets SIGTERM at
// once; one that keeps running gets SIGKILL after --kill-after, with its
// children, and run exits 76 without taking the lease again.
func TestRunKillsACommandThatOutlivesItsLostLease(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	api := p.url("api", "")
	client := leaseapi.NewClient(api)
	d := t.TempDir()
	// The command notes SIGTERM and goes on; its loop then marks that it
	// outlived the signal. Only SIGKILL ends it.
	script := `echo "$FENCING_OWNER" > "$D/owner"; echo $$ > "$D/pid"
trap 'touch "$D/term"' TERM
touch "$D/started"
while :; do [ -e "$D/term" ] && touch "$D/after-term"; sleep 0.05; done`
	r := startBG(t, []string{"FENCEGATE_API_URL=" + api, "D=" + d},
		"run", "--resource", "job:kill", "--ttl", "3s", "--kill-after", "1s", "--", "sh", "-c", script)
	waitFile(t, filepath.Join(d, "started"), 30*time.Second, r)
	pid, err := strconv.Atoi(readFile(t, filepath.Join(d, "pid")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	ctx := context.Background()
	st, err := client.Status(ctx, "job:kill")
	if err != nil || st.Lease == nil || st.Lease.Owner != readFile(t, filepath.Join(d, "owner")) {
		t.Fatalf("status while the command runs: %+v, %v", st, err)
	}
	if ok, err := client.Release(ctx, "job:kill", st.Lease.Owner, st.Lease.Token, false); !ok || err != nil {
		t.Fatalf("release behind run's back: %v, %v", ok, err)
	}
	if code := r.wait(30 * time.Second); code != exitLeaseLost {
		t.Fatalf("run exited %d, want %d\n%s", code, exitLeaseLost, r.stderr)
	}
	if readFile(t, filepath.Join(d, "term")) != "" || readFile(t, filepath.Join(d, "after-term")) != "" {
		t.Fatal("the term and after-term marks are not empty files")
	}
	for limit := time.Now().Add(10 * time.Second); !processGone(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(limit) {
			t.Fatal("the command outlived run")
		}
	}
	if !strings.Contains(r.stderr.String(), "SIGKILL") {
		t.Errorf("run did not say it would kill the command:\n%s", r.stderr)
	}
	st, err = client.Status(ctx, "job:kill")
	if err != nil || st.Lease != nil || st.Previous == nil || st.Issued != st.Previous.Token {
		t.Fatalf("status after run: %+v, %v (run must not take the lease again)", st, err)
	}
}

// TestRunStopsTheCommandWhenTheAPIStopsAnswering is the lost-lease story:
// the lease API stops answering (SIGSTOP), fencegate run stops the command
// before the lease expires on the server and exits 76; the next owner gets
// a higher token, and the old command's late write through the gate is
// refused.
func TestRunStopsTheCommandWhenTheAPIStopsAnswering(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	upstream := startDemoUpstream(t)
	p := start(t, t.TempDir(), []string{
		"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + upstream,
		"FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}",
	}, "api", "gate")
	api, gate := p.url("api", ""), p.url("gate", "")
	client := leaseapi.NewClient(api)
	ctx := context.Background()
	d := t.TempDir()
	// The command writes once, then on SIGTERM waits for the test's cue
	// and makes a late write with its old token (--kill-after is long
	// enough for it).
	script := `put() { curl -sS -o "$D/$1-body" -w '%{http_code}' -X PUT -H "Fencing-Token: $FENCING_TOKEN" --data "$2" "$GATE/jobs/9" > "$D/$1"; }
put first '{"by":"old","step":1}'
trap 'touch "$D/term"; while [ ! -e "$D/go-late" ]; do sleep 0.05; done; put late "{\"by\":\"old\",\"step\":2}"; exit 0' TERM
touch "$D/started"
while :; do sleep 0.05; done`
	r := startBG(t, []string{"FENCEGATE_API_URL=" + api, "D=" + d, "GATE=" + gate},
		"run", "--resource", "job:9", "--ttl", "2s", "--kill-after", "30s", "--", "sh", "-c", script)
	waitFile(t, filepath.Join(d, "started"), 30*time.Second, r)
	if got := readFile(t, filepath.Join(d, "first")); got != "200" {
		t.Fatalf("the command's first write: %s %s", got, readFile(t, filepath.Join(d, "first-body")))
	}

	// Stop the server right after a renewal, so the expiry it reported is
	// the one it keeps while stopped.
	st, err := client.Status(ctx, "job:9")
	if err != nil || st.Lease == nil {
		t.Fatalf("status: %+v, %v", st, err)
	}
	old := *st.Lease
	var serverExpiry time.Time
	for limit := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := client.Status(ctx, "job:9")
		if err != nil || st.Lease == nil || st.Lease.Token != old.Token {
			t.Fatalf("status: %+v, %v", st, err)
		}
		if !st.Lease.ExpiresAt.Equal(old.ExpiresAt) {
			serverExpiry = st.Lease.ExpiresAt
			break
		}
		if time.Now().After(limit) {
			t.Fatal("the lease was never renewed")
		}
	}
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	term := filepath.Join(d, "term")
	waitFile(t, term, 30*time.Second, r)
	fi, err := os.Stat(term)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Before(serverExpiry) {
		t.Fatalf("the command got SIGTERM at %v, not before the lease expired on the server at %v", fi.ModTime(), serverExpiry)
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	next := fg(t, []string{"FENCEGATE_API_URL=" + api}, "", "lease", "acquire", "job:9", "--owner", "next", "--ttl", "30s", "--wait", "10s")
	if next.code != 0 {
		t.Fatalf("the next owner's acquire: %d %s", next.code, next.stderr)
	}
	newToken := fencing.Token(next.jsonLine(t)["token"].(float64))
	if newToken <= old.Token {
		t.Fatalf("the next owner got token %d after %d", newToken, old.Token)
	}
	if st, _, _ := call(t, "PUT", gate+"/jobs/9", map[string]string{"Fencing-Token": newToken.String()}, `{"by":"new"}`); st != 200 {
		t.Fatalf("the next owner's write: %d", st)
	}

	if err := os.WriteFile(filepath.Join(d, "go-late"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(30 * time.Second); code != exitLeaseLost {
		t.Fatalf("run exited %d, want 76\n%s", code, r.stderr)
	}
	var late map[string]any
	if got := readFile(t, filepath.Join(d, "late")); got != "409" || json.Unmarshal([]byte(readFile(t, filepath.Join(d, "late-body"))), &late) != nil || late["code"] != "stale-token" {
		t.Fatalf("the old command's late write: %s %v", got, late)
	}
	if st, item, _ := call(t, "GET", upstream+"/jobs/9", nil, ""); st != 200 || item["fencing_token"] != newToken.String() {
		t.Fatalf("the upstream holds %d %v, want the next owner's write", st, item)
	}
	if !strings.Contains(r.stderr.String(), "lease lost") {
		t.Errorf("run did not say the lease was lost:\n%s", r.stderr)
	}
}

// TestRunKilledStopsTheCommand: when fencegate run itself is killed
// (SIGKILL, the OOM killer), so that nothing forwards a signal or renews
// the lease, the command gets SIGTERM from the kernel (Linux) instead of
// working on as if it held the lease.
func TestRunKilledStopsTheCommand(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	d := t.TempDir()
	script := `echo $$ > "$D/pid"
trap 'touch "$D/term"; exit 0' TERM
touch "$D/started"
while :; do sleep 0.05; done`
	r := startBG(t, []string{"FENCEGATE_API_URL=" + p.url("api", ""), "D=" + d}, "run", "--resource", "job:orphan", "--ttl", "5s", "--", "sh", "-c", script)
	waitFile(t, filepath.Join(d, "started"), 30*time.Second, r)
	pid, err := strconv.Atoi(readFile(t, filepath.Join(d, "pid")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(d, "term"), 30*time.Second, r)
	for limit := time.Now().Add(30 * time.Second); !processGone(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(limit) {
			t.Fatal("the command still runs after fencegate run was killed")
		}
	}
}

// TestRunEndsWhatTheCommandLeftBehind: a background job the command left
// in its process group when it exited is killed before the lease is
// released, so it cannot work on with the token once another owner may
// hold the lease; and a lease that had already ended when the command
// exited (released behind run's back here) makes run exit 76, not 0.
func TestRunEndsWhatTheCommandLeftBehind(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	api := p.url("api", "")
	d := t.TempDir()
	r := startBG(t, []string{"FENCEGATE_API_URL=" + api, "D=" + d}, "run", "--resource", "job:left", "--ttl", "5s", "--", "sh", "-c",
		`sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$D/job"; exit 0`)
	if code := r.wait(30 * time.Second); code != 0 {
		t.Fatalf("run exited %d\n%s", code, r.stderr)
	}
	job, err := strconv.Atoi(readFile(t, filepath.Join(d, "job")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(job, syscall.SIGKILL) })
	for limit := time.Now().Add(10 * time.Second); !processGone(job); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(limit) {
			t.Fatal("the command's background job still runs after run released the lease")
		}
	}

	client := leaseapi.NewClient(api)
	script := `touch "$D/started"; while [ ! -e "$D/go" ]; do sleep 0.05; done`
	r = startBG(t, []string{"FENCEGATE_API_URL=" + api, "D=" + d}, "run", "--resource", "job:gone", "--owner", "w", "--ttl", "30s", "--", "sh", "-c", script)
	waitFile(t, filepath.Join(d, "started"), 30*time.Second, r)
	st, err := client.Status(context.Background(), "job:gone")
	if err != nil || st.Lease == nil {
		t.Fatalf("status: %+v %v", st, err)
	}
	if ok, err := client.Release(context.Background(), "job:gone", "w", st.Lease.Token, false); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := os.WriteFile(filepath.Join(d, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(30 * time.Second); code != 76 {
		t.Fatalf("run whose lease had ended before the command exited: exit %d, want 76\n%s", code, r.stderr)
	}
}

// TestRunSignalledWhileAcquiring: a signal that fencegate run forwards to
// CMD, sent while run still waits for the lease (--wait forever), ends the
// wait instead: run exits (130 for SIGINT and SIGTERM, as an interrupted
// lease command does; 128+N for SIGHUP and SIGQUIT, as a shell reports a
// process they end), CMD never starts, and no lease is left behind, also
// after the holder lets go. Before, SIGHUP and SIGQUIT were caught (to be
// forwarded) and nothing else: run waited on, and once it got the lease it
// started CMD only to pass it the old signal.
func TestRunSignalledWhileAcquiring(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	api := p.url("api", "")
	client := leaseapi.NewClient(api)
	ctx := context.Background()
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			d := t.TempDir()
			resource := "job:acq-" + strings.ToLower(strings.TrimPrefix(unix.SignalName(sig), "SIG"))
			held, err := client.Acquire(ctx, resource, leaseapi.AcquireOptions{Owner: "holder", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			r := startBG(t, []string{"FENCEGATE_API_URL=" + api, "D=" + d}, "run", "--resource", resource, "--wait", "forever", "--", "sh", "-c", `touch "$D/ran"`)
			for limit := time.Now().Add(30 * time.Second); !strings.Contains(r.stderr.String(), "is held by"); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(limit) {
					t.Fatalf("run did not report its wait: %s", r.stderr)
				}
			}
			if err := r.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			want := 128 + int(sig)
			if sig == syscall.SIGINT || sig == syscall.SIGTERM {
				want = exitInterrupted
			}
			if code := r.wait(20 * time.Second); code != want || !strings.Contains(r.stderr.String(), "not started") {
				t.Fatalf("run signalled (%v) while waiting: exit %d, want %d, and the command said not started\n%s", sig, code, want, r.stderr)
			}
			if ok, err := client.Release(ctx, resource, "holder", held.Token, false); !ok || err != nil {
				t.Fatalf("the holder's release: %v, %v", ok, err)
			}
			if _, err := os.Stat(filepath.Join(d, "ran")); err == nil {
				t.Fatal("the command ran")
			}
			if st, err := client.Status(ctx, resource); err != nil || st.Lease != nil || st.Issued != held.Token {
				t.Fatalf("status after the holder let go: %+v, %v; want no lease and no other token issued", st, err)
			}
		})
	}
}
