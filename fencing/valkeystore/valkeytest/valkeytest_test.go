package valkeytest

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Skip and Fatal instead of ending
// the goroutine.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Skip(args ...any)          { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatal(args ...any)         { r.failed = fmt.Sprint(args...) }
func (r *recorder) Fatalf(f string, a ...any) { r.failed = fmt.Sprintf(f, a...) }

func TestMissingBinarySkipsOrFails(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("FENCEGATE_QUICK", "")
	for _, c := range []struct {
		require, ci string
		wantFail    bool
	}{{"", "", false}, {"1", "", true}, {"", "true", true}, {"0", "false", false}} {
		t.Setenv("FENCEGATE_REQUIRE_VALKEY", c.require)
		t.Setenv("CI", c.ci)
		r := &recorder{TB: t}
		binaries(r)
		if c.wantFail && (r.failed == "" || r.skipped != "") || !c.wantFail && (r.skipped == "" || r.failed != "") {
			t.Errorf("require=%q CI=%q: skipped %q, failed %q", c.require, c.ci, r.skipped, r.failed)
		}
		if msg := r.skipped + r.failed; !strings.Contains(msg, "redis-server") {
			t.Errorf("message %q does not say what to install", msg)
		}
	}
}

func TestStartRestartKill(t *testing.T) {
	s := Start(t, WithPersistence())
	s.MustDo("SET", "k", "v")
	s.Restart()
	if got := s.MustDo("GET", "k"); got != "v" {
		t.Fatalf("after a restart with persistence GET k = %q", got)
	}
	e := Start(t)
	e.MustDo("SET", "k", "v")
	port := e.Addr()
	e.Restart()
	if e.Addr() != port {
		t.Fatalf("restart moved the server from %s to %s", port, e.Addr())
	}
	if got := e.MustDo("EXISTS", "k"); got != "0" {
		t.Fatalf("after a restart without persistence EXISTS k = %q", got)
	}
	e.Kill()
	if _, err := e.Do("PING"); err == nil {
		t.Fatal("PING answered after Kill")
	}
}
