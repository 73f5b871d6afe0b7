package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestReloadsRunsEveryItemAndNamesFailures(t *testing.T) {
	var logs bytes.Buffer
	r := &reloads{log: slog.New(slog.NewJSONHandler(&logs, nil))}
	var ran []string
	r.add("FENCEGATE_RULES_FILE /etc/rules", func() error { ran = append(ran, "rules"); return errors.New("line 3: bad pattern") })
	r.add("FENCEGATE_API_TLS_CERT /etc/api.crt", func() error { ran = append(ran, "tls"); return nil })
	if failed := r.reload(context.Background()); failed != 1 {
		t.Fatalf("reload: %d failed, want 1", failed)
	}
	if strings.Join(ran, ",") != "rules,tls" {
		t.Fatalf("ran %v: a failure must not stop the items after it", ran)
	}
	out := logs.String()
	for _, want := range []string{`"msg":"reload refused: the configuration in force stays","what":"FENCEGATE_RULES_FILE /etc/rules","error":"line 3: bad pattern"`, `"msg":"reloaded","what":"FENCEGATE_API_TLS_CERT /etc/api.crt"`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s\n%s", want, out)
		}
	}
}

func TestReloadsRunOnEachSignal(t *testing.T) {
	r := &reloads{log: slog.New(slog.DiscardHandler)}
	done := make(chan struct{}, 2)
	r.add("x", func() error { done <- struct{}{}; return nil })
	ch := make(chan os.Signal, 1)
	stop := r.run(context.Background(), ch)
	defer stop()
	for range 2 {
		ch <- syscall.SIGHUP
		<-done // a reload per signal; the test hangs (and times out) otherwise
	}
}
