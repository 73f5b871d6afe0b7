package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/leaseapi"
)

// TestWaitingIsReportedOnStderr: lease acquire --wait and run --wait on a
// lease another owner holds say on stderr that they wait, naming the
// holder, how long its lease runs and how long they wait, and then that
// they acquired it; stdout carries only the token (lease acquire --output
// token) or CMD's output (run). An acquisition that does not wait says
// nothing; one that waits in vain ends with the lease-held problem as the
// last line of stderr.
func TestWaitingIsReportedOnStderr(t *testing.T) {
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:"}, "api")
	api := p.url("api", "")
	client := leaseapi.NewClient(api)
	ctx := context.Background()
	env := []string{"FENCEGATE_API_URL=" + api}

	for _, tc := range []struct {
		resource, prefix, until string
		args                    []string
	}{
		{"job:w1", "fencegate", "up to 30s", []string{"lease", "acquire", "job:w1", "--owner", "worker-b", "--wait", "30s", "--output", "token"}},
		{"job:w2", "fencegate", "until acquired", []string{"lease", "acquire", "job:w2", "--owner", "worker-b", "--wait", "forever", "--output", "token"}},
		{"job:w3", "fencegate run", "up to 30s", []string{"run", "--resource", "job:w3", "--owner", "worker-b", "--wait", "30s", "--", "sh", "-c", `echo "$FENCING_TOKEN"`}},
	} {
		held, err := client.Acquire(ctx, tc.resource, leaseapi.AcquireOptions{Owner: "worker-a", TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		r := fg(t, env, "", tc.args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", tc.args, r.code, r.stdout, r.stderr)
		}
		tok := strings.TrimSuffix(r.stdout, "\n")
		if n, err := strconv.ParseUint(tok, 10, 64); r.stdout != tok+"\n" || !isToken(tok) || err != nil || n <= uint64(held.Token) {
			t.Errorf("%v: stdout %q, want the new token (above %v) alone", tc.args, r.stdout, held.Token)
		}
		want := regexp.MustCompile(`^` + regexp.QuoteMeta(tc.prefix+": "+tc.resource+` is held by "worker-a"`) +
			` \(its lease ends in [12]s unless renewed\); waiting ` + tc.until + "\n" +
			regexp.QuoteMeta(tc.prefix+": acquired "+tc.resource+" after ") + `[0-9.]+s\n$`)
		if !want.MatchString(r.stderr) {
			t.Errorf("%v: stderr %q, want it to match %v", tc.args, r.stderr, want)
		}
	}

	// Acquired at once: as quiet as ever.
	if r := fg(t, env, "", "lease", "acquire", "job:free", "--owner", "worker-b", "--wait", "30s", "--output", "token"); r.code != 0 || r.stderr != "" || !isToken(strings.TrimSuffix(r.stdout, "\n")) {
		t.Fatalf("acquired at once: exit %d, stdout %q, stderr %q; want 0, a token and nothing", r.code, r.stdout, r.stderr)
	}
	// Not acquired within the wait: the report, then the refusal.
	if _, err := client.Acquire(ctx, "job:long", leaseapi.AcquireOptions{Owner: "worker-a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	r := fg(t, env, "", "lease", "acquire", "job:long", "--owner", "worker-b", "--wait", "1s", "--output", "token")
	if r.code != exitRefused || r.stdout != "" || !strings.HasPrefix(r.stderr, `fencegate: job:long is held by "worker-a" (its lease ends in `) {
		t.Fatalf("not acquired: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if pr := r.afterWait(t).problem(t); pr["code"] != "lease-held" || pr["holder"] != "worker-a" {
		t.Fatalf("not acquired: problem %v", pr)
	}
}
