package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/freeport"
)

// TestHealthWait: health --wait asks again until the answer is ready, and
// fails with the last attempt's reason once the wait has passed; without
// --wait it asks once.
func TestHealthWait(t *testing.T) {
	defer func(d time.Duration) { healthRetry = d }(healthRetry)
	healthRetry = time.Millisecond

	// notReadyFor answers 503 to the first n requests, then 200.
	notReadyFor := func(n int64) (*httptest.Server, *atomic.Int64) {
		var asked atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if asked.Add(1) <= n {
				http.Error(w, "starting", http.StatusServiceUnavailable)
			}
		}))
		t.Cleanup(srv.Close)
		return srv, &asked
	}
	run := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := health(context.Background(), args, nil, &out, &errb)
		return out.String() + errb.String(), err
	}

	srv, asked := notReadyFor(3)
	if out, err := run("--url", srv.URL, "--wait", "1m"); err != nil || !strings.Contains(out, "ready") || asked.Load() != 4 {
		t.Fatalf("--wait on a server ready at the 4th request: %v %q after %d requests", err, out, asked.Load())
	}

	srv, asked = notReadyFor(1 << 40)
	_, err := run("--url", srv.URL, "--wait", "500ms")
	if code, _ := exitCode(err); code != exitFailure || !strings.Contains(err.Error(), "503") || asked.Load() < 2 {
		t.Fatalf("--wait on a server never ready: %v (exit %d) after %d requests, want exit 1 naming the 503 after several", err, code, asked.Load())
	}

	// An attempt that the end of the wait cuts short does not hide the
	// answer before it: a server that answered 503 and then stalls.
	var stalled atomic.Int64
	stall := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if stalled.Add(1) == 1 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		<-r.Context().Done()
	}))
	t.Cleanup(stall.Close)
	_, err = run("--url", stall.URL, "--wait", "300ms")
	if code, _ := exitCode(err); code != exitFailure || !strings.Contains(err.Error(), "503") || stalled.Load() < 2 {
		t.Fatalf("--wait on a server that answered 503, then stalled: %v (exit %d) after %d requests, want exit 1 naming the 503", err, code, stalled.Load())
	}

	srv, asked = notReadyFor(1)
	_, err = run("--url", srv.URL)
	if code, _ := exitCode(err); code != exitFailure || asked.Load() != 1 {
		t.Fatalf("without --wait: %v (exit %d) after %d requests, want exit 1 after one", err, code, asked.Load())
	}

	addr, ferr := freeport.Addr() // nothing listens there
	if ferr != nil {
		t.Fatal(ferr)
	}
	_, err = run("--url", "http://"+addr+"/readyz", "--wait", "200ms")
	if code, _ := exitCode(err); code != exitFailure || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("--wait with nothing listening: %v (exit %d), want exit 1 naming the connection", err, code)
	}

	_, err = run("--wait", "-1s")
	if code, _ := exitCode(err); code != exitUsage {
		t.Fatalf("--wait -1s: %v (exit %d), want %d", err, code, exitUsage)
	}
}
