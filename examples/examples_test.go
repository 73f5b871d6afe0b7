// Package examples_test runs the example workers (examples/python and
// examples/go) against the real fencegate binary and the demo upstream,
// including a lease lost mid-run, and the commands of the README's quick
// start and of every example's README as written.
package examples_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/freeport"
	"github.com/fencegate/fencegate/internal/mdblock"
	"github.com/fencegate/fencegate/internal/syncbuf"
	"github.com/fencegate/fencegate/internal/tiedproc"
)

// bin holds the binaries built once for every test: fencegate and the Go
// example worker.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencegate-examples")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = dir
	for _, pkg := range []string{"github.com/fencegate/fencegate/cmd/fencegate", "github.com/fencegate/fencegate/examples/go/worker"} {
		// -trimpath, as runREADMEScript's scripts build: their builds,
		// running side by side, then find every package in the cache.
		build := exec.Command("go", "build", "-trimpath", "-o", dir, pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building", pkg+":", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a process a test started; it is killed at cleanup if still
// running (and continued first, in case the test stopped it).
type proc struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []string // stdout and stderr lines, in order
	newLn  chan struct{}
	exited chan struct{}
	err    error
}

func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := tiedproc.Start(cmd, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, newLn: make(chan struct{}, 1), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.newLn <- struct{}{}:
			default:
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("%s output:\n%s", name, strings.Join(p.output(), "\n"))
		}
	})
	return p
}

func (p *proc) output() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lines)
}

// event is one JSON line of a worker or of fencegate's logs.
type event map[string]any

func (e event) str(k string) string {
	switch v := e[k].(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return ""
}

func (p *proc) events() []event {
	var evs []event
	for _, l := range p.output() {
		var e event
		if json.Unmarshal([]byte(l), &e) == nil {
			evs = append(evs, e)
		}
	}
	return evs
}

// waitFor waits until match holds for the process's events; the bound only
// keeps a broken test from hanging.
func (p *proc) waitFor(t *testing.T, what string, match func([]event) bool) []event {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		evs := p.events()
		if match(evs) {
			return evs
		}
		select {
		case <-p.newLn:
		case <-p.exited:
			if evs := p.events(); match(evs) {
				return evs
			}
			t.Fatalf("%s exited (%v) before %s:\n%s", p.name, p.err, what, strings.Join(p.output(), "\n"))
		case <-deadline:
			t.Fatalf("%s: no %s:\n%s", p.name, what, strings.Join(p.output(), "\n"))
		}
	}
}

// count returns how many events match.
func count(evs []event, match func(event) bool) int {
	n := 0
	for _, e := range evs {
		if match(e) {
			n++
		}
	}
	return n
}

// leadToken is the token of the first "lead" event, "" before one.
func leadToken(evs []event) string {
	for _, e := range evs {
		if e.str("event") == "lead" {
			return e.str("token")
		}
	}
	return ""
}

func is(kind string, kv ...string) func(event) bool {
	return func(e event) bool {
		if e.str("event") != kind {
			return false
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if e.str(kv[i]) != kv[i+1] {
				return false
			}
		}
		return true
	}
}

// quickStartRules is the one gate configuration of the README's quick
// start, which every example worker runs against (TestREADMEUsesOneGate
// keeps the two in step).
const quickStartRules = "PUT,PATCH,DELETE /jobs/{id} fence job:{id}"

// stack is a demo upstream with fencegate in front of it, configured as
// the README's quick start configures it.
type stack struct {
	upstream *proc
	gate     *proc
	api      string // http://host:port
	gateURL  string
}

func startStack(t *testing.T) *stack { return startStackEnv(t, "http://") }

// startStackEnv starts the stack with extra FENCEGATE_* settings (KEY=VALUE)
// for fencegate; apiScheme is the lease API's (https:// with TLS).
func startStackEnv(t *testing.T, apiScheme string, env ...string) *stack {
	t.Helper()
	up := startProc(t, "demo-upstream", filepath.Join(bin, "fencegate"), "demo-upstream", "127.0.0.1:0")
	upAddr := up.waitFor(t, "listening", func(evs []event) bool {
		return slices.ContainsFunc(evs, func(e event) bool { return e.str("msg") == "demo upstream listening" })
	})
	var addr string
	for _, e := range upAddr {
		if e.str("msg") == "demo upstream listening" {
			addr = e.str("addr")
		}
	}
	args := append([]string{"env", "FENCEGATE_STORE=memory:", "FENCEGATE_API_ADDR=127.0.0.1:0",
		"FENCEGATE_PROXY_ADDR=127.0.0.1:0", "FENCEGATE_UPSTREAM=http://" + addr, "FENCEGATE_RULES=" + quickStartRules}, env...)
	fg := startProc(t, "fencegate", append(args, filepath.Join(bin, "fencegate"), "serve")...)
	evs := fg.waitFor(t, "listening", func(evs []event) bool {
		return count(evs, func(e event) bool { return e.str("msg") == "listening" }) >= 2
	})
	s := &stack{upstream: up, gate: fg}
	for _, e := range evs {
		if e.str("msg") != "listening" {
			continue
		}
		switch e.str("listener") {
		case "api":
			s.api = apiScheme + e.str("addr")
		case "gate":
			s.gateURL = "http://" + e.str("addr")
		}
	}
	if s.api == "" || s.gateURL == "" {
		t.Fatalf("listeners: %v", evs)
	}
	return s
}

// applied returns the fencing tokens of the writes the upstream applied to
// path, in the order it applied them.
func (s *stack) applied(path string) []string {
	var toks []string
	for _, e := range s.upstream.events() {
		if e.str("msg") == "applied" && e.str("path") == path {
			toks = append(toks, e.str("fencing_token"))
		}
	}
	return toks
}

// call sends a JSON request and decodes the answer.
func call(t *testing.T, method, url, body string, hdr ...string) (int, event) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e event
	_ = json.NewDecoder(bytes.NewReader(raw)).Decode(&e)
	return resp.StatusCode, e
}

// oneHolderAtATime checks the upstream's record: the writes it applied
// come in runs by token, in increasing token order, never interleaved: no
// write of an older holder was applied after a newer holder's first write.
func oneHolderAtATime(t *testing.T, toks []string) {
	t.Helper()
	last := int64(0)
	for i, s := range toks {
		tok, err := strconv.ParseInt(s, 10, 64)
		if err != nil || tok < last {
			t.Fatalf("write %d applied with token %q after token %d; applied: %v", i, s, last, toks)
		}
		last = tok
	}
}

func pythonWorker(t *testing.T, s *stack, args ...string) *proc {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is required (scripts/test.sh installs it)")
	}
	return startProc(t, "python worker", append([]string{py, "python/worker.py", "--api", s.api, "--gate", s.gateURL}, args...)...)
}

// The Python worker writes every step with its token, checkpoints, and
// releases as finished.
func TestPythonWorker(t *testing.T) {
	s := startStack(t)
	w := pythonWorker(t, s, "--resource", "job:py", "--owner", "py-1", "--ttl", "5", "--steps", "4", "--interval", "0.05")
	<-w.exited
	if w.err != nil {
		t.Fatalf("worker: %v\n%s", w.err, strings.Join(w.output(), "\n"))
	}
	st, status := call(t, "GET", s.api+"/v1/leases/job:py", "")
	prev, _ := status["previous"].(map[string]any)
	if st != 200 || status["lease"] != nil || prev["ended"] != "released" || prev["finished"] != true || prev["owner"] != "py-1" {
		t.Fatalf("status after the worker: %d %v", st, status)
	}
	// Tokens follow the store's clock: every write carries the one lease's.
	tok := event(prev).str("token")
	if got, want := s.applied("/jobs/py"), strings.Repeat(tok+",", 4); tok == "" || strings.Join(got, ",")+"," != want {
		t.Fatalf("upstream applied tokens %v, want four writes with the lease's token %q", got, tok)
	}
	_, cp := call(t, "GET", s.api+"/v1/leases/job:py/checkpoint", "")
	if state, _ := cp["state"].(map[string]any); state["next"] != float64(4) {
		t.Fatalf("checkpoint %v", cp)
	}
}

// The Python worker is paused past its TTL; another owner takes the lease
// and writes. When the worker resumes it must stop (exit 76) and none of
// its writes may be applied after the new owner's.
func TestPythonWorkerLosesLease(t *testing.T) {
	s := startStack(t)
	w := pythonWorker(t, s, "--resource", "job:py", "--owner", "py-1", "--ttl", "2", "--steps", "100000", "--interval", "0.05")
	w.waitFor(t, "three writes", func(evs []event) bool { return count(evs, is("write")) >= 3 })
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	st, l := call(t, "POST", s.api+"/v1/leases/job:py/acquire", `{"owner":"usurper","ttl_seconds":30,"wait_seconds":30}`)
	// Tokens follow the store's clock: the usurper's is whatever it got.
	usurper := l.str("token")
	if st != 200 || usurper == "" || usurper == "0" {
		t.Fatalf("usurper acquire: %d %v", st, l)
	}
	if st, _ := call(t, "PUT", s.gateURL+"/jobs/py", `{"owner":"usurper"}`, "Fencing-Token", usurper); st != 200 {
		t.Fatalf("usurper write: %d", st)
	}
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the worker kept running after losing its lease")
	}
	if code := w.cmd.ProcessState.ExitCode(); code != 76 {
		t.Fatalf("worker exit status %d, want 76\n%s", code, strings.Join(w.output(), "\n"))
	}
	if count(w.events(), is("lost")) != 1 {
		t.Fatalf("no lost event:\n%s", strings.Join(w.output(), "\n"))
	}
	toks := s.applied("/jobs/py")
	oneHolderAtATime(t, toks)
	if toks[len(toks)-1] != usurper {
		t.Fatalf("applied %v: the usurper's write is not the last", toks)
	}
}

// Two Go example workers campaign for one resource. The leader is paused
// (SIGSTOP) past its TTL; the other takes over with a newer token; the old
// leader, resumed, steps down, and none of its writes is applied after the
// new leader's first. The upstream's record shows exactly one writer at a
// time, in token order.
func TestGoWorkersElectOneLeaderAtATime(t *testing.T) {
	s := startStack(t)
	worker := func(owner string) *proc {
		return startProc(t, "go worker "+owner, filepath.Join(bin, "worker"), "-api", s.api, "-gate", s.gateURL,
			"-resource", "job:go", "-owner", owner, "-ttl", "2s", "-interval", "50ms")
	}
	// Tokens follow the store's clock: each leader's is the one it led with.
	a := worker("a")
	ta := leadToken(a.waitFor(t, "a leading and writing", func(evs []event) bool {
		return count(evs, is("write", "token", leadToken(evs))) >= 3
	}))
	b := worker("b")
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	tb := leadToken(b.waitFor(t, "b leading and writing", func(evs []event) bool {
		return count(evs, is("write", "token", leadToken(evs))) >= 3
	}))
	if ta == tb {
		t.Fatalf("a and b both led with token %s", ta)
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "a stepping down", func(evs []event) bool { return count(evs, is("step-down", "token", ta)) == 1 })
	b.waitFor(t, "b writing on", func(evs []event) bool { return count(evs, is("write", "token", tb)) >= 6 })
	// Stop a first (it is waiting for the lease), then b, so b's release
	// cannot hand the lease to a on its way out.
	for _, p := range []*proc{a, b} {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.exited:
			if p.err != nil {
				t.Fatalf("%s: %v\n%s", p.name, p.err, strings.Join(p.output(), "\n"))
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s did not exit on SIGTERM", p.name)
		}
	}
	toks := s.applied("/jobs/go")
	oneHolderAtATime(t, toks)
	if !slices.Contains(toks, ta) || !slices.Contains(toks, tb) {
		t.Fatalf("applied %v, want writes of both leaders", toks)
	}
	// Each process led at most once per token, and a never led again while
	// b held the lease.
	if n := count(a.events(), is("lead")); n != 1 {
		t.Fatalf("a led %d times:\n%s", n, strings.Join(a.output(), "\n"))
	}
	if n := count(b.events(), is("lead", "token", tb)); n != 1 {
		t.Fatalf("b led %d times with token %s", n, tb)
	}
	// b released when stopped.
	_, st := call(t, "GET", s.api+"/v1/leases/job:go", "")
	if prev, _ := st["previous"].(map[string]any); st["lease"] != nil || prev["owner"] != "b" || prev["ended"] != "released" {
		t.Fatalf("status after both stopped: %v", st)
	}
}

// TestGoWorkerSteps runs the Go worker as the README does, with -steps: it
// writes every step, releases the lease as finished and exits 0 (it used
// to release with its term's context, which the release itself cancels,
// and campaign again forever).
func TestGoWorkerSteps(t *testing.T) {
	s := startStack(t)
	w := startProc(t, "go worker", filepath.Join(bin, "worker"), "-api", s.api, "-gate", s.gateURL,
		"-resource", "job:44", "-owner", "go-1", "-ttl", "5s", "-steps", "5", "-interval", "10ms")
	select {
	case <-w.exited:
	case <-time.After(time.Minute):
		t.Fatalf("the worker did not exit after its steps:\n%s", strings.Join(w.output(), "\n"))
	}
	if w.err != nil {
		t.Fatalf("worker: %v\n%s", w.err, strings.Join(w.output(), "\n"))
	}
	if n := count(w.events(), is("lead")); n != 1 {
		t.Fatalf("the worker led %d times, want once:\n%s", n, strings.Join(w.output(), "\n"))
	}
	if count(w.events(), is("done")) != 1 {
		t.Fatalf("no done event:\n%s", strings.Join(w.output(), "\n"))
	}
	tok := leadToken(w.events())
	if got, want := s.applied("/jobs/44"), strings.Repeat(tok+",", 5); tok == "" || strings.Join(got, ",")+"," != want {
		t.Fatalf("upstream applied tokens %v, want five writes with the token %q it led with", got, tok)
	}
	_, st := call(t, "GET", s.api+"/v1/leases/job:44", "")
	if prev, _ := st["previous"].(map[string]any); st["lease"] != nil || prev["ended"] != "released" || prev["finished"] != true {
		t.Fatalf("status after the worker: %v", st)
	}
}

// TestGoWorkerReportsAnUnreachableAPI: a Go worker whose lease API does
// not answer says so (a retry event naming the failure, once a second) and
// leads once the API is up, rather than wait without a sign.
func TestGoWorkerReportsAnUnreachableAPI(t *testing.T) {
	api, gate := freeAddr(t), freeAddr(t) // nothing listens there yet
	w := startProc(t, "go worker", filepath.Join(bin, "worker"), "-api", "http://"+api, "-gate", "http://"+gate,
		"-resource", "job:45", "-ttl", "5s")
	w.waitFor(t, "two retry events", func(evs []event) bool {
		return count(evs, is("retry", "what", "acquire")) >= 2
	})
	for _, e := range w.events() {
		if is("retry")(e) && !strings.Contains(e.str("error"), "connect") {
			t.Fatalf("retry event without the connection's failure: %v", e)
		}
	}
	s := startStackEnv(t, "http://", "FENCEGATE_API_ADDR="+api, "FENCEGATE_PROXY_ADDR="+gate) // the later settings win
	evs := w.waitFor(t, "a lead once the API is up", func(evs []event) bool { return count(evs, is("lead")) == 1 })
	_, st := call(t, "GET", s.api+"/v1/leases/job:45", "")
	if l, _ := st["lease"].(map[string]any); l == nil || event(l).str("token") != leadToken(evs) {
		t.Fatalf("the worker leads with token %s; the API says %v", leadToken(evs), st)
	}
}

// TestWorkersPrintTheRefusalCode: a write the gate refuses is reported
// with its problem code, not a bare status (here the path matches no rule:
// resource-required).
func TestWorkersPrintTheRefusalCode(t *testing.T) {
	s := startStack(t)
	gw := startProc(t, "go worker", filepath.Join(bin, "worker"), "-api", s.api, "-gate", s.gateURL,
		"-resource", "job:x", "-path", "/work/{id}", "-ttl", "5s", "-steps", "1")
	pw := pythonWorker(t, s, "--resource", "job:y", "--path", "/work/{id}", "--ttl", "5", "--steps", "1")
	for _, w := range []*proc{gw, pw} {
		select {
		case <-w.exited:
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s did not exit", w.name)
		}
		if w.err == nil {
			t.Errorf("%s exited 0 after a refused write", w.name)
		}
		if count(w.events(), is("error", "code", "resource-required")) != 1 {
			t.Errorf("%s did not print the refusal's code:\n%s", w.name, strings.Join(w.output(), "\n"))
		}
	}
}

// TestREADMEUsesOneGate: the README's quick start configures the gate the
// examples' tests run against.
func TestREADMEUsesOneGate(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "FENCEGATE_RULES='"+quickStartRules+"'") {
		t.Fatalf("README.md does not configure the gate with FENCEGATE_RULES='%s'", quickStartRules)
	}
}

// TestREADMEQuickStart runs the README's quick start as written: its two
// shell blocks, one after the other (runREADMEScript). It checks the
// zombie write is refused, the successor's write stays, and every worker
// exits 0.
func TestREADMEQuickStart(t *testing.T) {
	t.Parallel() // the README scripts mostly wait: on free ports, in their own directories
	needTools(t, "bash", "curl", "python3", "go")
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section, ok := mdblock.Section(string(readme), "## Quick start")
	if !ok {
		t.Fatal("README.md has no Quick start section")
	}
	blocks := mdblock.Shell(section)
	if len(blocks) != 2 {
		t.Fatalf("the quick start has %d shell blocks, want 2", len(blocks))
	}
	text := runREADMEScript(t, strings.Join(blocks, "\n"))
	for _, want := range []string{
		`"code":"stale-token"`,       // the zombie's write, refused
		`"body":{"step":1,"by":"b"}`, // the successor's write stays
		`{"released":true}`,          // worker-b's release
		`"event": "done"`,            // the Python worker finished
		`"event":"done"`,             // the Go worker finished
		`"path":"/jobs/42"`,          // the shell worker wrote
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the quick start's output lacks %s:\n%s", want, text)
		}
	}
}

// TestExampleREADMEs runs each example's README as written: all its shell
// blocks, in order, in one script (runREADMEScript), and checks the output
// each README promises: the worker's run to the end, and for Python and Go
// a paused worker that loses its lease and whose token the gate refuses.
func TestExampleREADMEs(t *testing.T) {
	needTools(t, "bash", "curl", "python3", "go")
	for _, tc := range []struct {
		dir    string
		blocks int
		want   []string
	}{
		{"shell", 2, []string{
			`resuming after step 0`,                    // the worker started under fencegate run
			`done after step 5`,                        // and finished
			`"path":"/jobs/42","body":{"step":5,"by":`, // the service holds the last step
		}},
		{"python", 3, []string{
			`"event": "done"`,            // the first worker finished
			`"released": true`,           // and released
			`"path":"/jobs/43","body":{`, // the service holds its last step:
			`"step":4},`,                 // step 4
			`"by":"py-2"`,                // the successor's write was applied
			"py-1 exited 76",             // the paused worker found its lease lost
			`"event": "lost"`,            // and said so
			`"code":"stale-token"`,       // its token is refused at the gate
		}},
		{"go", 3, []string{
			`"event":"done"`,                  // the first worker finished
			`"path":"/jobs/44","body":{`,      // the service holds its last step:
			`"step":4,"token":`,               // step 4
			`"event":"lead","owner":"b"`,      // b took over
			`"event":"step-down","owner":"a"`, // a stepped down
			`"code":"stale-token"`,            // a's token is refused at the gate
		}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			t.Parallel()
			readme, err := os.ReadFile(filepath.Join(tc.dir, "README.md"))
			if err != nil {
				t.Fatal(err)
			}
			blocks := mdblock.Shell(string(readme))
			if len(blocks) != tc.blocks {
				t.Fatalf("examples/%s/README.md has %d shell blocks, want %d", tc.dir, len(blocks), tc.blocks)
			}
			text := runREADMEScript(t, strings.Join(blocks, "\n"))
			// A newcomer sees no error the README does not show: a log
			// file waited for before the background worker created it
			// used to print "grep: a.log: No such file or directory".
			if strings.Contains(text, "No such file or directory") {
				t.Errorf("examples/%s/README.md's commands print an error:\n%s", tc.dir, text)
			}
			for _, want := range tc.want {
				if !strings.Contains(text, want) {
					t.Errorf("examples/%s/README.md's output lacks %s:\n%s", tc.dir, want, text)
				}
			}
		})
	}
}

// TestDocsWalkthroughs runs the walkthroughs of docs/ as written, each in
// a fresh directory (runREADMEScript): gate.md's zombie worker with curl
// and workers.md's examples (each starts its own service and gate),
// lease-api.md's leases with curl and workers.md's command-line block, after
// the fencegate each asks to have running (here in the background, its
// output in a file, ended with the script's process group at cleanup).
func TestDocsWalkthroughs(t *testing.T) {
	needTools(t, "bash", "curl", "python3", "go")
	// serve is what a page asks to have running first: lease-api.md's
	// `go run ./cmd/fencegate`, workers.md's fencegate on the PATH.
	const goRun = "go run ./cmd/fencegate >fencegate.log 2>&1 &\n" +
		"for i in $(seq 600); do curl -s http://127.0.0.1:7070/v1/leases && break; sleep 0.2; done >/dev/null\n"
	const onPath = "go build -o fencegate ./cmd/fencegate && export PATH=\"$PWD:$PATH\"\n" +
		"fencegate serve >fencegate.log 2>&1 &\n" +
		"for i in $(seq 100); do fencegate health && break; sleep 0.2; done >/dev/null 2>&1\n"
	for _, tc := range []struct {
		name, page, heading string
		block, blocks       int // the block run, of how many in the section
		before              string
		want                []string
	}{
		{"gate zombie", "gate.md", "## The zombie worker, with curl", 0, 1, "", []string{
			`"body":{"step":1,"by":"a"}`,          // worker-a's write, forwarded
			`"code":"stale-token"`,                // the zombie's write, refused
			`"body":{"step":1,"by":"b"}`,          // worker-b's write stays
			`"code":"token-not-issued"`,           // the forged token, refused
			`"body":{"step":2,"by":"b"},"fencing`, // and worker-b is not locked out
		}},
		{"lease-api walkthrough", "lease-api.md", "## Walkthrough: leases with curl", 0, 1, goRun, []string{
			`"owner":"worker-a","token":`,                        // worker-a's lease
			`"code":"lease-held"`,                                // worker-b refused
			`"holder":"worker-a"`,                                // and told who holds it
			`{"released":true}`,                                  // worker-a's release
			`"owner":"worker-b","token":`,                        // worker-b takes over
			`{"state":{"done":17}`,                               // and reads the checkpoint
			`"ended":"released","finished":false`,                // and how worker-a left
			`{"leases":[{"resource":"job:42","owner":"worker-b"`, // the live leases
		}},
		{"workers CLI", "workers.md", "## Command line", 0, 3, onPath, []string{
			`{"resource":"job:42","owner":"worker-a","token":`, // acquire, again by its holder
			`"ttl_seconds":60`,                // renew --ttl 60s
			`{"state":{"done":18}`,            // the last checkpoint, from stdin
			`{"leases":[{"resource":"job:42"`, // list
			`{"released":true}`,               // the releases
		}},
		{"workers examples", "workers.md", "## Examples", 0, 1, "", []string{
			`done after step 5`,          // the shell worker finished
			`"event": "done"`,            // the Python worker finished
			`"event":"done"`,             // the Go worker finished
			`"path":"/jobs/44","body":{`, // the upstream holds their writes
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			section, ok := mdblock.Section(readDoc(t, tc.page), tc.heading)
			if !ok {
				t.Fatalf("docs/%s has no section %q", tc.page, tc.heading)
			}
			blocks := mdblock.Shell(section)
			if len(blocks) != tc.blocks {
				t.Fatalf("docs/%s's %q has %d shell blocks, want %d", tc.page, tc.heading, len(blocks), tc.blocks)
			}
			text := runREADMEScript(t, tc.before+blocks[tc.block])
			for _, want := range tc.want {
				if !strings.Contains(text, want) {
					t.Errorf("docs/%s's %q: the output lacks %s:\n%s", tc.page, tc.heading, want, text)
				}
			}
		})
	}
}

func readDoc(t *testing.T, page string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", page))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (scripts/test.sh installs it)", tool)
		}
	}
}

// runREADMEScript runs a script of a README's commands as a user would from
// a fresh clone: in one bash with -e, from a copy of the checkout made of
// links to its files (so what the script builds and writes lands in a
// temporary directory). Only the addresses change, to free ports: the
// service's, the gate's and the lease API's in the text; for the defaults
// the text relies on, the lease API's also through FENCEGATE_API_ADDR and
// FENCEGATE_API_URL, the gate's through FENCEGATE_PROXY_ADDR and GATE_URL
// (the workers' default gate); GOFLAGS gains -trimpath. The script runs in its own
// process group, killed at cleanup (it starts servers in the background,
// which a failing line would leave running), and for at most four minutes.
// It returns the script's output; a command that fails fails the test, and
// the failure shows the script's output and the logs it left (*.log).
func runREADMEScript(t *testing.T, script string) string {
	t.Helper()
	up, gate, api := freeAddr(t), freeAddr(t), freeAddr(t)
	script = strings.ReplaceAll(script, "127.0.0.1:9000", up)
	script = strings.ReplaceAll(script, "127.0.0.1:8080", gate)
	script = strings.ReplaceAll(script, "127.0.0.1:7070", api)
	if regexp.MustCompile(`127\.0\.0\.1:(7070|8080|9000)\b`).MatchString(script) {
		t.Fatalf("a default port is left in the script:\n%s", script)
	}

	dir := t.TempDir()
	entries, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == ".git" || e.Name() == "fencegate" || e.Name() == "worker" || strings.HasSuffix(e.Name(), ".db") || strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		abs, _ := filepath.Abs(filepath.Join("..", e.Name()))
		if err := os.Symlink(abs, filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "-e", "-c", script)
	cmd.Dir = dir
	// -trimpath keeps the script's go build and go run out of the
	// temporary directory's path, so the build cache serves every run
	// (without it, each new directory compiles the module's packages anew).
	goflags := strings.TrimSpace(os.Getenv("GOFLAGS") + " -trimpath")
	cmd.Env = append(os.Environ(), "FENCEGATE_API_ADDR="+api, "FENCEGATE_API_URL=http://"+api, "FENCEGATE_PROXY_ADDR="+gate, "GATE_URL=http://"+gate, "GOFLAGS="+goflags)
	cmd.WaitDelay = 10 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(4 * time.Minute):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("the script did not finish in 4 minutes:\n%s\noutput:\n%s%s", script, out.String(), scriptLogs(dir))
	}
	if err != nil {
		t.Fatalf("the script failed: %v\n%s\noutput:\n%s%s", err, script, out.String(), scriptLogs(dir))
	}
	return out.String()
}

// scriptLogs is the text of the logs a README script left in dir (the
// gate's, the service's, the workers'), for a failure's message: what the
// servers it started in the background said is otherwise lost with dir.
func scriptLogs(dir string) string {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var b strings.Builder
	for _, name := range logs {
		text, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		if len(text) > 16<<10 {
			text = append([]byte("…"), text[len(text)-16<<10:]...)
		}
		fmt.Fprintf(&b, "\n%s:\n%s", filepath.Base(name), text)
	}
	return b.String()
}

// freeAddr is a loopback address with a port free a moment ago, outside
// the range that outgoing connections take theirs from (freeport).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
