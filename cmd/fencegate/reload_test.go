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
	"time"

	"github.com/fencegate/fencegate/internal/certs/certstest"
	"github.com/fencegate/fencegate/internal/syncbuf"
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
	defer stop(time.Minute)
	for range 2 {
		ch <- syscall.SIGHUP
		<-done // a reload per signal; the test hangs (and times out) otherwise
	}
}

// TestReloadsStopDoesNotWaitForABlockedReload: a reload blocked for good
// (a file on a hung network mount) must not hold the loop's stop, which
// serve runs on its way out: stop returns after its wait, reports the
// reload left behind and logs the item it is stuck in. Before, stop waited
// for the reload without limit, and a drained process never exited.
func TestReloadsStopDoesNotWaitForABlockedReload(t *testing.T) {
	var logs syncbuf.Buffer
	r := &reloads{log: slog.New(slog.NewJSONHandler(&logs, nil))}
	started, block := make(chan struct{}), make(chan struct{})
	defer close(block) // lets the goroutine left behind end with the test
	r.add("FENCEGATE_RULES_FILE /mnt/hung/rules", func() error { close(started); <-block; return nil })
	ch := make(chan os.Signal, 1)
	stop := r.run(context.Background(), ch)
	ch <- syscall.SIGHUP
	<-started
	stopped := make(chan bool, 1)
	go func() { stopped <- stop(10 * time.Millisecond) }()
	select {
	case none := <-stopped:
		if none {
			t.Error("stop reported no reload left behind while one was blocked")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stop has not returned 10s after its 10ms wait: it waits for the blocked reload")
	}
	want := `"msg":"a reload is still running (blocked reading a file?); stopping without it","what":"FENCEGATE_RULES_FILE /mnt/hung/rules"`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %s\n%s", want, logs.String())
	}
	// An idle loop stops at once, reporting nothing left.
	idle := (&reloads{log: slog.New(slog.DiscardHandler)}).run(context.Background(), make(chan os.Signal, 1))
	if !idle(time.Minute) {
		t.Error("stop of an idle loop reported a reload left behind")
	}
}

// TestTLSReloadNamesTheVariableAtFault: a SIGHUP reload of a listener's
// TLS files that do not load is logged with the variable that names the
// file at fault: _CLIENT_CA for a client CA bundle with no certificate,
// _CERT and _KEY for a pair that does not match (either file may be the
// wrong one).
func TestTLSReloadNamesTheVariableAtFault(t *testing.T) {
	set := certstest.New(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	r := &reloads{log: log}
	if _, err := listenerTLS(context.Background(), "PROXY_TLS", set.ServerCert, set.ServerKey, set.CAFile, 0, r, log); err != nil {
		t.Fatal(err)
	}
	certstest.WriteFile(t, set.CAFile, []byte("not a certificate\n"))
	if failed := r.reload(context.Background()); failed != 1 {
		t.Fatalf("reload with a bad client CA bundle: %d failed, want 1", failed)
	}
	want := `"error":"FENCEGATE_PROXY_TLS_CLIENT_CA: CA bundle ` + set.CAFile + ` holds no PEM certificate"`
	if out := logs.String(); !strings.Contains(out, want) {
		t.Errorf("log lacks %s\n%s", want, out)
	}
	set.CA.Write(t, set.Dir, "ca")
	certstest.WriteFile(t, set.ServerKey, set.Client.KeyPEM)
	logs.Reset()
	if failed := r.reload(context.Background()); failed != 1 {
		t.Fatalf("reload with a mismatched key: %d failed, want 1", failed)
	}
	if want := `"error":"FENCEGATE_PROXY_TLS_CERT and FENCEGATE_PROXY_TLS_KEY: certificate ` + set.ServerCert + ` with key ` + set.ServerKey; !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %s\n%s", want, logs.String())
	}
}
