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

	"github.com/fencegate/fencegate/internal/certs/certstest"
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
