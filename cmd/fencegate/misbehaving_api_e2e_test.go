package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/leaseapi"
)

// TestWaitPacesAnAPIThatAnswersAtOnce: an API that answers lease-held at
// once, ignoring wait_seconds, is not hammered through a --wait: lease
// acquire and run pause at least leaseapi.AcquireRetryFloor between
// attempts, and end with the refusal (3, 75) within the wait. Both used
// to retry at once, thousands of times.
func TestWaitPacesAnAPIThatAnswersAtOnce(t *testing.T) {
	const wait = 2 * time.Second
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"lease", "acquire", "job:1", "--owner", "me", "--wait", wait.String()}, exitRefused},
		{[]string{"run", "--resource", "job:1", "--owner", "me", "--wait", wait.String(), "--", "true"}, exitNotAcquired},
	} {
		srv, waits := fakeAcquireAPI(t, 1<<30)
		r := fg(t, []string{"FENCEGATE_API_URL=" + srv.URL}, "", tc.args...)
		if r.code != tc.want {
			t.Errorf("%v: exit %d, stderr %q; want %d", tc.args, r.code, r.stderr, tc.want)
		}
		// Every pause is at least the floor and no attempt starts after
		// the wait: no more than this many fit, however slow the machine.
		if n, most := len(waits()), int(wait/leaseapi.AcquireRetryFloor)+1; n < 2 || n > most {
			t.Errorf("%v: %d acquisitions in a %v wait; want 2 to %d", tc.args, n, wait, most)
		}
	}
}

// notTheAPI serves h as if it were the lease API at a wrong URL.
func notTheAPI(t *testing.T, h http.HandlerFunc) []string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return []string{"FENCEGATE_API_URL=" + srv.URL}
}

// TestAnswersNotFromTheLeaseAPIExit4: an answer that is not the lease
// API's, a 404 or 405 page of another server (used to exit 3, refused)
// or a 200 whose body is not the API's JSON (used to exit 1), exits 4,
// saying the URL does not look like the lease API. A real refusal by the
// API (no-checkpoint) still exits 3 (TestLeaseCommands).
func TestAnswersNotFromTheLeaseAPIExit4(t *testing.T) {
	cases := map[string]http.HandlerFunc{
		"404 page": http.NotFound,
		"405":      func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusMethodNotAllowed) },
		"another API's JSON 404": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"code":"lease-held","message":"no route"}`)
		},
		"200 page": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html><body>It works!</body></html>")
		},
	}
	for name, h := range cases {
		env := notTheAPI(t, h)
		for _, args := range [][]string{
			{"lease", "status", "job:1"},
			{"lease", "acquire", "job:1", "--owner", "me", "--output", "token"},
			{"lease", "list", "--all"},
			{"run", "--resource", "job:1", "--wait", "0s", "--", "true"},
		} {
			r := fg(t, env, "", args...)
			if r.code != exitUnavailable || !strings.Contains(r.stderr, "lease API") {
				t.Errorf("%s: %v: exit %d, stderr %q; want 4 naming the lease API", name, args, r.code, r.stderr)
			}
		}
	}
}

// TestAnEndlessAnswerExits4: a 200 answer larger than any the lease API
// sends is cut off at leaseapi.MaxAnswerBytes and exits 4.
func TestAnEndlessAnswerExits4(t *testing.T) {
	env := notTheAPI(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"resource":"`)
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	r := fg(t, env, "", "lease", "status", "job:1")
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "larger than") {
		t.Fatalf("an endless answer: exit %d, stderr %q; want 4 saying it is too large", r.code, r.stderr)
	}
}

// silentAPI is a lease API address that accepts connections and never
// answers on them.
func silentAPI(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // read nothing, answer nothing
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestAcquisitionBoundedByTheWait: against an API that takes the
// connection and never answers, run and lease acquire with a short --wait
// give up after the wait plus acquireGrace, exit 4 (not acquired: the API
// is unusable), instead of waiting out the client's 90 s timeout. The
// bound asserted is generous; the old behaviour overran fg's minute. The
// two commands wait out their grace side by side (each is a process that
// sleeps, not one that computes).
func TestAcquisitionBoundedByTheWait(t *testing.T) {
	env := []string{"FENCEGATE_API_URL=" + silentAPI(t)}
	for _, args := range [][]string{
		{"run", "--resource", "job:1", "--wait", "0s", "--", "true"},
		{"lease", "acquire", "job:1", "--owner", "me", "--wait", "1s"},
	} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			r := fg(t, env, "", args...)
			took := time.Since(start)
			if r.code != exitUnavailable {
				t.Errorf("%v: exit %d after %v, stderr %q; want 4", args, r.code, took, r.stderr)
			}
			if took > acquireGrace+15*time.Second {
				t.Errorf("%v: took %v; want about its --wait plus %v", args, took, acquireGrace)
			}
			if args[0] == "run" && !strings.Contains(r.stderr, "did not answer the acquisition") {
				t.Errorf("%v: stderr %q; want it to say the API did not answer", args, r.stderr)
			}
		})
	}
}

// TestAnswersThatAreNotAboutTheLeaseExit4: a 2xx whose body is JSON but
// not the lease API's answer about this lease (an echo service, another
// API, a proxy) is not a renewal, a checkpoint or a release that worked:
// renew, checkpoint and release exit 4 saying it does not look like the
// lease API, as acquire does, and print nothing on stdout for a script to
// take as the lease.
func TestAnswersThatAreNotAboutTheLeaseExit4(t *testing.T) {
	env := notTheAPI(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/renew") {
			// The lease API's shape, of another owner's lease.
			_, _ = io.WriteString(w, `{"resource":"job:1","owner":"other","token":7,"ttl_seconds":30,"acquired_at":"2030-01-01T00:00:00Z","expires_at":"2030-01-01T00:00:30Z"}`)
			return
		}
		_, _ = io.WriteString(w, `{"status":"ok","method":"`+r.Method+`"}`)
	})
	for _, args := range [][]string{
		{"lease", "renew", "job:1", "--owner", "me", "--token", "7"},
		{"lease", "checkpoint", "job:1", "--owner", "me", "--token", "7", "--state", `{"step":1}`},
		{"lease", "release", "job:1", "--owner", "me", "--token", "7", "--finished"},
	} {
		r := fg(t, env, "", args...)
		if r.code != exitUnavailable || !strings.Contains(r.stderr, "lease API") || r.stdout != "" {
			t.Errorf("%v against a server answering 200 with other JSON: exit %d, stdout %q, stderr %q; want 4 saying it does not look like the lease API",
				args[:2], r.code, r.stdout, r.stderr)
		}
	}
}

// TestRunOnAnAPITooSlowForTheTTLExits4: an API that grants the lease, but
// more slowly than the TTL allows (an overloaded store), makes run give the
// lease up without running the command, and exit 4 (the API unusable), not
// 75, which tells a scheduler that another owner holds the job's lease.
func TestRunOnAnAPITooSlowForTheTTLExits4(t *testing.T) {
	var acquires atomic.Int32
	env := notTheAPI(t, func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Owner      string `json:"owner"`
			TTLSeconds int    `json:"ttl_seconds"`
		}
		raw, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(raw, &req)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/acquire"):
			acquires.Add(1)
			time.Sleep(2200 * time.Millisecond) // slower than the 2s TTL
			now := time.Now().UTC()
			_ = json.NewEncoder(w).Encode(map[string]any{
				"resource": "job:slow", "owner": req.Owner, "token": 7, "ttl_seconds": req.TTLSeconds,
				"acquired_at": now.Format("2006-01-02T15:04:05.000Z07:00"),
				"expires_at":  now.Add(time.Duration(req.TTLSeconds) * time.Second).Format("2006-01-02T15:04:05.000Z07:00"),
			})
		case strings.HasSuffix(r.URL.Path, "/release"):
			_, _ = io.WriteString(w, `{"released":true}`)
		default:
			http.NotFound(w, r)
		}
	})
	d := t.TempDir()
	r := fg(t, append(env, "D="+d), "", "run", "--resource", "job:slow", "--owner", "me", "--ttl", "2s", "--wait", "0s", "--", "sh", "-c", `touch "$D/ran"`)
	if _, err := os.Stat(filepath.Join(d, "ran")); err == nil {
		t.Fatal("the command ran on a lease never safely held")
	}
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "local deadline") {
		t.Fatalf("run against an API that granted the lease slowly (no other owner, %d acquisitions): exit %d, want 4 (unavailable, not 75: lease-held)\nstderr: %s",
			acquires.Load(), r.code, r.stderr)
	}
}

// TestListAllEndsWhenPagesGoRound: a server whose next_cursor comes back
// to one already followed (A, B, A...: a cache between, a broken proxy)
// would keep 'lease list --all' asking for pages for ever, gathering them
// in memory; it exits 4 at the page that goes round.
func TestListAllEndsWhenPagesGoRound(t *testing.T) {
	var pages atomic.Int64
	env := notTheAPI(t, func(w http.ResponseWriter, r *http.Request) {
		pages.Add(1)
		next := "A"
		if r.URL.Query().Get("cursor") == "A" {
			next = "B"
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"leases":[],"next_cursor":"`+next+`"}`)
	})
	r := fg(t, env, "", "lease", "list", "--all")
	if r.code != exitUnavailable || pages.Load() != 3 {
		t.Fatalf("lease list --all on cursors A, B, A: exit %d after %d pages, stderr %q; want 4 after 3", r.code, pages.Load(), r.stderr)
	}
}
