package main

import (
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
)

// TestHTTPSUpstreamWithAPrivateCA: an https upstream is verified against
// the system's roots, so one whose certificate they do not know gets no
// request at all (502 upstream-unavailable); pointing SSL_CERT_FILE at
// its CA, Go's standard lookup, is all it takes to reach it. Read from
// the upstream's own count of the requests it received.
func TestHTTPSUpstreamWithAPrivateCA(t *testing.T) {
	var got atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{}`)
	}))
	up.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	up.StartTLS()
	defer up.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=" + up.URL, "FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}"}
	for _, tc := range []struct {
		name   string
		env    []string
		status int
		code   string
		want   int64
	}{
		{"system roots", nil, http.StatusBadGateway, "upstream-unavailable", 0},
		{"SSL_CERT_FILE", []string{"SSL_CERT_FILE=" + ca}, http.StatusOK, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got.Store(0)
			p := start(t, t.TempDir(), append(env, tc.env...), "api", "gate")
			st, lease, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"a","ttl_seconds":60}`)
			if st != http.StatusOK {
				t.Fatalf("acquire: %d %v", st, lease)
			}
			st, body, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": strconv.FormatInt(token(t, lease), 10)}, `{"step":1}`)
			if st != tc.status || (tc.code != "" && body["code"] != tc.code) {
				t.Fatalf("write: %d %v, want %d %s", st, body, tc.status, tc.code)
			}
			if n := got.Load(); n != tc.want {
				t.Fatalf("the upstream received %d requests, want %d", n, tc.want)
			}
		})
	}
}
