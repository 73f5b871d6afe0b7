package main

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencegate/fencegate/internal/logwriter"
)

// TestForcedExitMessageFollowsTheHeldLogLines: the second signal's
// message is written after the log lines an event loop's pass still
// holds, not ahead of them.
func TestForcedExitMessageFollowsTheHeldLogLines(t *testing.T) {
	var out strings.Builder
	var logs atomic.Pointer[logwriter.Writer]
	w := logwriter.New(&out)
	logs.Store(w)
	w.Hold() // a pass in progress
	_, _ = w.Write([]byte("held line\n"))
	_, _ = afterLogs{&logs, &out}.Write([]byte("second signal\n"))
	if got := out.String(); got != "held line\nsecond signal\n" {
		t.Fatalf("stderr got %q", got)
	}
	var none atomic.Pointer[logwriter.Writer] // no server running yet
	_, _ = afterLogs{&none, &out}.Write([]byte("x\n"))
	if !strings.HasSuffix(out.String(), "x\n") {
		t.Fatalf("stderr got %q", out.String())
	}
}
