package examples_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/certs/certstest"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// Two worker pools share one fencegate whose lease API serves mutual TLS
// with an access file: the Python worker of pool-a by its token, the Go
// worker of pool-b by its SPIFFE certificate alone. Each does its work;
// pool-a cannot work on pool-b's resources.
func TestWorkersOverMutualTLSWithAccessFile(t *testing.T) {
	set := certstest.New(t)
	poolB := set.CA.Client(t, certstest.ClientOptions{CommonName: "pool-b", URIs: []string{"spiffe://test/ns/batch/sa/pool-b"}})
	bCert, bKey := poolB.Write(t, set.Dir, "pool-b")
	file := filepath.Join(set.Dir, "access.yaml")
	doc := fmt.Sprintf(`clients:
  - name: pool-a
    token_sha256: %s
    allow: [{prefix: "job:a:", ops: [acquire, renew, release, checkpoint, read]}]
    bind_owner: true
  - name: pool-b
    cert_uri: spiffe://test/ns/batch/sa/pool-b
    allow: [{prefix: "job:b:", ops: [acquire, renew, release, checkpoint, read]}]
    bind_owner: true
`, access.HashToken("pool-a-token"))
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStackEnv(t, "https://", "FENCEGATE_API_TLS_CERT="+set.ServerCert, "FENCEGATE_API_TLS_KEY="+set.ServerKey,
		"FENCEGATE_API_TLS_CLIENT_CA="+set.CAFile, "FENCEGATE_ACCESS_FILE="+file)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is required (scripts/test.sh installs it)")
	}
	// pool-a: a token, and the generic client certificate the listener asks for.
	poolAEnv := []string{"env", "FENCEGATE_API_TOKEN=pool-a-token", "FENCEGATE_API_CA_FILE=" + set.CAFile,
		"FENCEGATE_API_CLIENT_CERT=" + set.ClientCert, "FENCEGATE_API_CLIENT_KEY=" + set.ClientKey}
	pyWorker := func(resource string) *proc {
		return startProc(t, "python worker "+resource, append(poolAEnv, py, "python/worker.py", "--api", s.api, "--gate", s.gateURL,
			"--resource", resource, "--owner", "pool-a/py", "--ttl", "5", "--steps", "3", "--interval", "0.05")...)
	}
	a := pyWorker("job:a:1")
	b := startProc(t, "go worker", "env", "FENCEGATE_API_CA_FILE="+set.CAFile, "FENCEGATE_API_CLIENT_CERT="+bCert, "FENCEGATE_API_CLIENT_KEY="+bKey,
		filepath.Join(bin, "worker"), "-api", s.api, "-gate", s.gateURL, "-resource", "job:b:1", "-owner", "pool-b/go",
		"-ttl", "5s", "-interval", "50ms", "-steps", "3")
	for _, w := range []*proc{a, b} {
		<-w.exited
		if w.err != nil {
			t.Fatalf("%s: %v\n%s", w.name, w.err, strings.Join(w.output(), "\n"))
		}
	}
	if got := s.applied("/jobs/a:1"); len(got) != 3 {
		t.Errorf("pool-a's writes applied: %v, want 3", got)
	}
	if got := s.applied("/jobs/b:1"); len(got) != 3 {
		t.Errorf("pool-b's writes applied: %v, want 3", got)
	}
	// pool-a on pool-b's resource: refused at the lease API, nothing written.
	x := pyWorker("job:b:2")
	<-x.exited
	if x.err == nil || !strings.Contains(strings.Join(x.output(), "\n"), "forbidden") {
		t.Fatalf("pool-a's worker on job:b:2: %v\n%s", x.err, strings.Join(x.output(), "\n"))
	}
	if got := s.applied("/jobs/b:2"); len(got) != 0 {
		t.Fatalf("writes applied for a resource pool-a may not take: %v", got)
	}
}
