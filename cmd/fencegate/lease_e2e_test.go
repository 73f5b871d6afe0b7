package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/leaseapi"
)

// TestLeaseCommands drives every lease command through the binary against
// a real server: success prints the API's JSON on one line of stdout, a
// refusal its problem on stderr, with exit statuses 0 and 3.
func TestLeaseCommands(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	env := []string{"FENCEGATE_API_URL=" + p.url("api", "")}
	lease := func(stdin string, args ...string) cliResult {
		t.Helper()
		return fg(t, env, stdin, append([]string{"lease"}, args...)...)
	}
	ok := func(r cliResult) map[string]any {
		t.Helper()
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("exit %d, stderr %q, want 0 and nothing", r.code, r.stderr)
		}
		return r.jsonLine(t)
	}
	refused := func(r cliResult, code string) map[string]any {
		t.Helper()
		if r.code != exitRefused || r.stdout != "" {
			t.Fatalf("exit %d, stdout %q; want 3 and nothing", r.code, r.stdout)
		}
		pr := r.problem(t)
		if pr["code"] != code {
			t.Fatalf("problem %v, want %s", pr, code)
		}
		return pr
	}

	l := ok(lease("", "acquire", "job:1", "--owner", "worker-a", "--ttl", "20s"))
	if l["resource"] != "job:1" || l["owner"] != "worker-a" || l["token"] == nil || l["ttl_seconds"] != 20.0 {
		t.Fatalf("acquire: %v", l)
	}
	// Tokens follow the store's clock: read them from the answers.
	tok := func(m map[string]any) uint64 { f, _ := m["token"].(float64); return uint64(f) }
	l1, t1 := l, strconv.FormatUint(tok(l), 10)
	ok(lease("", "acquire", "job:2", "--owner", "worker-a")) // the server's default TTL
	r := lease("", "acquire", "job:1", "--owner", "worker-b", "--wait", "1s")
	pr := refused(r.afterWait(t), "lease-held") // after the report of its wait
	if pr["holder"] != "worker-a" {
		t.Fatalf("lease-held names %v", pr["holder"])
	}
	if l := ok(lease("", "renew", "job:1", "--owner", "worker-a", "--token", t1, "--ttl", "30s")); l["ttl_seconds"] != 30.0 || l["token"] != l1["token"] {
		t.Fatalf("renew: %v", l)
	}
	refused(lease("", "renew", "job:1", "--owner", "worker-b", "--token", t1), "lease-lost")

	refused(lease("", "checkpoint", "job:1"), "no-checkpoint")
	if l := ok(lease("", "checkpoint", "job:1", "--owner", "worker-a", "--token", t1, "--state", `{"done": 3}`)); l["token"] != l1["token"] {
		t.Fatalf("checkpoint save: %v", l)
	}
	ok(lease(`{"done": 17, "cursor": "k17"}`+"\n", "checkpoint", "job:1", "--owner", "worker-a", "--token", t1, "--state", "-"))
	refused(lease("", "checkpoint", "job:1", "--owner", "worker-b", "--token", t1, "--state", "1"), "lease-lost")
	cp := ok(lease("", "checkpoint", "job:1"))
	if st, _ := cp["state"].(map[string]any); st["done"] != 17.0 || st["cursor"] != "k17" || cp["token"] != l1["token"] {
		t.Fatalf("checkpoint read: %v", cp)
	}

	st := ok(lease("", "status", "job:1"))
	if live, _ := st["lease"].(map[string]any); st["issued_token"] != l1["token"] || live["owner"] != "worker-a" || st["checkpoint"] == nil {
		t.Fatalf("status: %v", st)
	}
	if st := ok(lease("", "status", "never:used")); st["issued_token"] != 0.0 || st["lease"] != nil {
		t.Fatalf("status of an unknown resource: %v", st)
	}

	all := ok(lease("", "list"))
	if ls, _ := all["leases"].([]any); len(ls) != 2 {
		t.Fatalf("list: %v", all)
	}
	one := ok(lease("", "list", "--prefix", "job:", "--limit", "1"))
	if ls, _ := one["leases"].([]any); len(ls) != 1 || ls[0].(map[string]any)["resource"] != "job:1" {
		t.Fatalf("list --prefix job: --limit 1: %v", one)
	}
	if none := ok(lease("", "list", "--prefix", "other:")); len(none["leases"].([]any)) != 0 {
		t.Fatalf("list --prefix other: %v", none)
	}

	if r := ok(lease("", "release", "job:1", "--owner", "worker-a", "--token", t1, "--finished")); r["released"] != true {
		t.Fatalf("release: %v", r)
	}
	if r := ok(lease("", "release", "job:1", "--owner", "worker-a", "--token", t1)); r["released"] != false {
		t.Fatalf("repeated release: %v", r)
	}
	l = ok(lease("", "acquire", "job:1", "--owner", "worker-b"))
	if tok(l) <= tok(l1) {
		t.Fatalf("the next owner's token: %v", l)
	}
	t2 := strconv.FormatUint(tok(l), 10)
	refused(lease("", "release", "job:1", "--owner", "worker-a", "--token", t1), "lease-lost")
	cp = ok(lease("", "checkpoint", "job:1"))
	if prev, _ := cp["previous"].(map[string]any); prev["owner"] != "worker-a" || prev["ended"] != "released" || prev["finished"] != true {
		t.Fatalf("checkpoint after a handoff: %v", cp)
	}

	// The API finds the state too large (its default limit is 1 MiB).
	big := strconv.Quote(strings.Repeat("x", 2<<20))
	refused(lease(big, "checkpoint", "job:1", "--owner", "worker-b", "--token", t2, "--state", "-"), "payload-too-large")
}

func TestLeaseCommandsWithAPIToken(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_API_TOKEN=s3cret"}, "api")
	url := "FENCEGATE_API_URL=" + p.url("api", "")
	r := fg(t, []string{url}, "", "lease", "status", "job:1")
	if r.code != exitRefused || r.problem(t)["code"] != "unauthorized" {
		t.Fatalf("without the token: exit %d, stderr %q", r.code, r.stderr)
	}
	r = fg(t, []string{url, "FENCEGATE_API_TOKEN=wrong"}, "", "lease", "status", "job:1")
	if r.code != exitRefused {
		t.Fatalf("with a wrong token: exit %d, stderr %q", r.code, r.stderr)
	}
	r = fg(t, []string{url, "FENCEGATE_API_TOKEN=s3cret"}, "", "lease", "status", "job:1")
	if r.code != 0 || r.jsonLine(t)["resource"] != "job:1" {
		t.Fatalf("with the token: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestLeaseCommandsWithoutServerExit4(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	env := []string{"FENCEGATE_API_URL=http://" + addr}
	for _, args := range [][]string{
		{"lease", "acquire", "job:1", "--owner", "a"},
		{"lease", "status", "job:1"},
		{"lease", "list"},
		{"run", "--resource", "job:1", "--", "true"},
	} {
		r := fg(t, env, "", args...)
		if r.code != exitUnavailable || r.stdout != "" || r.stderr == "" {
			t.Errorf("fencegate %v without a server: exit %d, stdout %q, stderr %q; want 4", args, r.code, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stderr, "lease API at http://"+addr+" is unreachable") || strings.Contains(r.stderr, "store unavailable") {
			t.Errorf("fencegate %v without a server: stderr %q, want the lease API named unreachable", args, r.stderr)
		}
	}
}

// TestAPIFailureExitStatus covers the answers a healthy test server does
// not give: 5xx and store-unavailable exit 4, like a failed connection.
func TestAPIFailureExitStatus(t *testing.T) {
	c := &cli{stdout: io.Discard, stderr: io.Discard}
	for _, tc := range []struct {
		err  error
		want int
	}{
		{&leaseapi.ProblemError{Status: 503, Code: "store-unavailable", Type: problem.TypePrefix + "store-unavailable", Body: []byte(`{"code":"store-unavailable"}`)}, exitUnavailable},
		{&leaseapi.ProblemError{Status: 502}, exitUnavailable},
		{&leaseapi.ProblemError{Status: 500, Code: "internal", Type: problem.TypePrefix + "internal"}, exitUnavailable},
		{&leaseapi.ProblemError{Status: 400, Code: "invalid-request", Type: problem.TypePrefix + "invalid-request"}, exitUsage},
		{&leaseapi.ProblemError{Status: 409, Code: "lease-held", Type: problem.TypePrefix + "lease-held"}, exitRefused},
		{&leaseapi.ProblemError{Status: 401, Code: "unauthorized", Type: problem.TypePrefix + "unauthorized"}, exitRefused},
		{&leaseapi.ProblemError{Status: 404, Code: "no-checkpoint", Type: problem.TypePrefix + "no-checkpoint"}, exitRefused},
		// Not the API's problem documents: another server answered.
		{&leaseapi.ProblemError{Status: 404}, exitUnavailable},
		{&leaseapi.ProblemError{Status: 405}, exitUnavailable},
		{&leaseapi.ProblemError{Status: 409, Code: "lease-held"}, exitUnavailable},
		{&leaseapi.ProblemError{Status: 400, Detail: "the server speaks HTTPS: use an https:// URL"}, exitUsage},
		{fmt.Errorf("dial: %w", fencing.ErrUnavailable), exitUnavailable},
		{fmt.Errorf("read: %w", fencing.ErrAmbiguous), exitUnavailable},
		{fmt.Errorf("decode: %w", leaseapi.ErrBadAnswer), exitUnavailable},
		{errors.New("something else"), exitFailure},
	} {
		if got, _ := exitCode(c.apiFailure(tc.err)); got != tc.want {
			t.Errorf("apiFailure(%v) exits %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestLeaseListPages: `lease list` pages with --limit and --cursor, and
// --all follows next_cursor to every lease, through the binary, on the
// memory and file stores.
func TestLeaseListPages(t *testing.T) {
	for _, store := range []string{"memory:", "file:"} {
		t.Run(strings.TrimSuffix(store, ":"), func(t *testing.T) {
			dir := t.TempDir()
			spec := store
			if store == "file:" {
				spec += dir + "/fencegate.db"
			}
			p := start(t, dir, []string{"FENCEGATE_STORE=" + spec}, "api")
			env := []string{"FENCEGATE_API_URL=" + p.url("api", "")}
			lease := func(args ...string) cliResult {
				t.Helper()
				return fg(t, env, "", append([]string{"lease"}, args...)...)
			}
			ok := func(r cliResult) map[string]any {
				t.Helper()
				if r.code != 0 || r.stderr != "" {
					t.Fatalf("exit %d, stderr %q, want 0 and nothing", r.code, r.stderr)
				}
				return r.jsonLine(t)
			}
			names := func(m map[string]any) []string {
				var out []string
				for _, l := range m["leases"].([]any) {
					out = append(out, l.(map[string]any)["resource"].(string))
				}
				return out
			}
			var want []string
			for i := range 7 {
				res := "page:" + strconv.Itoa(i)
				want = append(want, res)
				ok(lease("acquire", res, "--owner", "w"))
			}
			ok(lease("acquire", "other", "--owner", "w"))
			gone := ok(lease("acquire", "page:3x", "--owner", "w")) // released: not listed
			ok(lease("release", "page:3x", "--owner", "w", "--token", strconv.FormatFloat(gone["token"].(float64), 'f', -1, 64)))
			// By hand, pages of 3: the cursor moves on, the last page says null.
			var got []string
			var cursor string
			for i := 0; ; i++ {
				args := []string{"list", "--prefix", "page:", "--limit", "3"}
				if cursor != "" {
					args = append(args, "--cursor", cursor)
				}
				page := ok(lease(args...))
				got = append(got, names(page)...)
				next, isStr := page["next_cursor"].(string)
				if !isStr {
					if page["next_cursor"] != nil || len(names(page)) == 3 {
						t.Fatalf("page %d: next_cursor %v after %d leases", i, page["next_cursor"], len(names(page)))
					}
					break
				}
				if i > 5 {
					t.Fatal("the pages never end")
				}
				cursor = next
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("pages by hand: %v, want %v", got, want)
			}
			for _, size := range []string{"1", "2", "7", "0"} {
				all := ok(lease("list", "--prefix", "page:", "--all", "--limit", size))
				if got := names(all); strings.Join(got, " ") != strings.Join(want, " ") || all["next_cursor"] != nil {
					t.Fatalf("list --all --limit %s: %v, next_cursor %v; want %v", size, got, all["next_cursor"], want)
				}
			}
			if r := lease("list", "--all", "--cursor", cursor); r.code != exitUsage {
				t.Fatalf("list --all --cursor: exit %d, want %d", r.code, exitUsage)
			}
			if r := lease("list", "--cursor", "bm90IGEgbmFtZQ"); r.code != exitUsage || r.problem(t)["code"] != "invalid-request" {
				t.Fatalf("list with a forged cursor: exit %d, stderr %q; want %d and invalid-request", r.code, r.stderr, exitUsage)
			}
		})
	}
}

// TestLeaseCommandInterrupted: Ctrl-C (SIGINT) while a lease command waits
// for the API's answer ends it with 130 and says so; it is not reported as
// the API unavailable or the store's outcome unknown (exit 4).
func TestLeaseCommandInterrupted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	arrived := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			close(arrived)
		}
		_, _ = io.Copy(io.Discard, c) // never answers
	}()
	r := startBG(t, []string{"FENCEGATE_API_URL=http://" + ln.Addr().String()}, "lease", "acquire", "job:1", "--owner", "a", "--wait", "30s")
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("the acquisition never reached the API")
	}
	if err := r.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(20 * time.Second); code != exitInterrupted || !strings.Contains(r.stderr.String(), "interrupted") || strings.Contains(r.stderr.String(), "store") {
		t.Fatalf("interrupted acquisition: exit %d, stderr %q; want 130 and the interruption named", code, r.stderr)
	}
}
