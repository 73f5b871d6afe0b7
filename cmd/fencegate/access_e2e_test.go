package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/fencegate/fencegate/internal/certs/certstest"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// accessSetup is a fencegate whose lease API serves mutual TLS with an
// access file, and the clients of that file.
type accessSetup struct {
	p          *proc
	api        string
	set        *certstest.Set
	file       string
	poolBCert  string // pool-b's certificate and key files (no token)
	poolBKey   string
	withCert   *http.Client // presents the generic client certificate (not in the file)
	poolB      *http.Client // presents pool-b's certificate
	clientEnvs []string     // CLI environment: URL, CA, generic client certificate
}

func accessFileDoc() string {
	return fmt.Sprintf(`clients:
  - name: pool-a
    token_sha256: %s
    allow: [{prefix: "job:a:", ops: [acquire, renew, release, checkpoint, read]}]
    bind_owner: true
  - name: pool-b
    cert_uri: spiffe://test/pool-b
    allow: [{prefix: "job:b:", ops: [acquire, renew, release, checkpoint, read]}]
    bind_owner: true
  - name: reader
    token_sha256: %s
    allow: [{prefix: "", ops: [read]}]
  - name: mixed
    token_sha256: %s
    allow:
      - {prefix: "job:", ops: [read]}
      - {prefix: "job:a:", ops: [renew]}
      - {prefix: "other:", ops: [acquire, release]}
  - name: admin
    token_sha256: %s
    allow: [{prefix: "", ops: [acquire, renew, release, checkpoint, read]}]
`, access.HashToken("tok-a"), access.HashToken("tok-r"), access.HashToken("tok-m"), access.HashToken("tok-admin"))
}

func newAccessSetup(t *testing.T) *accessSetup {
	t.Helper()
	s := &accessSetup{set: certstest.New(t)}
	s.file = filepath.Join(s.set.Dir, "access.yaml")
	if err := os.WriteFile(s.file, []byte(accessFileDoc()), 0o600); err != nil {
		t.Fatal(err)
	}
	pb := s.set.CA.Client(t, certstest.ClientOptions{CommonName: "pool-b", URIs: []string{"spiffe://test/pool-b"}})
	s.poolBCert, s.poolBKey = pb.Write(t, s.set.Dir, "pool-b")
	s.p = start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:",
		"FENCEGATE_API_TLS_CERT=" + s.set.ServerCert, "FENCEGATE_API_TLS_KEY=" + s.set.ServerKey,
		"FENCEGATE_API_TLS_CLIENT_CA=" + s.set.CAFile, "FENCEGATE_ACCESS_FILE=" + s.file}, "api")
	s.api = "https://" + s.p.addr["api"]
	mk := func(pair certstest.Pair) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.set.CA.Pool(), Certificates: []tls.Certificate{pair.TLS(t)}}}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	s.withCert, s.poolB = mk(s.set.Client), mk(pb)
	s.clientEnvs = []string{"FENCEGATE_API_URL=" + s.api, "FENCEGATE_API_CA_FILE=" + s.set.CAFile,
		"FENCEGATE_API_CLIENT_CERT=" + s.set.ClientCert, "FENCEGATE_API_CLIENT_KEY=" + s.set.ClientKey}
	return s
}

// do sends a request as the client known by tok (a bearer token) or, when
// tok is "cert:pool-b", by pool-b's certificate alone.
func (s *accessSetup) do(t *testing.T, tok, method, path, body string) (int, map[string]any, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.api+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := s.withCert
	switch {
	case tok == "cert:pool-b":
		hc = s.poolB
	case tok != "":
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m, string(raw)
}

// status is the admin's view of a resource.
func (s *accessSetup) status(t *testing.T, res string) map[string]any {
	t.Helper()
	st, m, raw := s.do(t, "tok-admin", "GET", "/v1/leases/"+res, "")
	if st != 200 {
		t.Fatalf("admin status %s: %d %s", res, st, raw)
	}
	return m
}

// TestAccessTableThroughTheBinary: every client × operation × prefix, and
// what the store holds afterwards: an allowed call is done, a refused one
// answers 403 forbidden and leaves the resource as it was.
func TestAccessTableThroughTheBinary(t *testing.T) {
	s := newAccessSetup(t)
	clients := map[string]string{"pool-a": "tok-a", "pool-b": "cert:pool-b", "reader": "tok-r", "mixed": "tok-m"}
	allowed := map[string]map[string][]string{ // client -> prefix -> ops
		"pool-a": {"job:a:": {"acquire", "renew", "release", "checkpoint", "read"}},
		"pool-b": {"job:b:": {"acquire", "renew", "release", "checkpoint", "read"}},
		"reader": {"job:a:": {"read"}, "job:b:": {"read"}, "other:": {"read"}},
		"mixed":  {"job:a:": {"read", "renew"}, "job:b:": {"read"}, "other:": {"acquire", "release"}},
	}
	may := func(client, prefix, op string) bool {
		for _, o := range allowed[client][prefix] {
			if o == op {
				return true
			}
		}
		return false
	}
	for client, tok := range clients {
		owner := client + "/w"
		for _, prefix := range []string{"job:a:", "job:b:", "other:"} {
			for _, op := range []string{"acquire", "renew", "release", "checkpoint", "read"} {
				res := prefix + op + "-" + client
				name := client + " " + op + " " + res
				ok := may(client, prefix, op)
				want := map[bool]int{true: 200, false: 403}[ok]
				var tokN float64
				if op != "acquire" {
					// The lease to act on, taken by the admin for this client's owner.
					st, m, raw := s.do(t, "tok-admin", "POST", "/v1/leases/"+res+"/acquire", `{"owner":"`+owner+`","ttl_seconds":60}`)
					if st != 200 {
						t.Fatalf("%s: admin acquire: %d %s", name, st, raw)
					}
					tokN = m["token"].(float64)
				}
				held := fmt.Sprintf(`{"owner":%q,"token":%d`, owner, int64(tokN))
				var st int
				var raw string
				switch op {
				case "acquire":
					st, _, raw = s.do(t, tok, "POST", "/v1/leases/"+res+"/acquire", `{"owner":"`+owner+`"}`)
				case "renew":
					st, _, raw = s.do(t, tok, "POST", "/v1/leases/"+res+"/renew", held+`,"ttl_seconds":3600}`)
				case "release":
					st, _, raw = s.do(t, tok, "POST", "/v1/leases/"+res+"/release", held+"}")
				case "checkpoint":
					st, _, raw = s.do(t, tok, "PUT", "/v1/leases/"+res+"/checkpoint", held+`,"state":{"step":1}}`)
				case "read":
					st, _, raw = s.do(t, tok, "GET", "/v1/leases/"+res, "")
					st2, _, raw2 := s.do(t, tok, "GET", "/v1/leases/"+res+"/checkpoint", "")
					if wantCP := map[bool]int{true: 404, false: 403}[ok]; st2 != wantCP {
						t.Errorf("%s: checkpoint read %d %s, want %d", name, st2, raw2, wantCP)
					}
				}
				if st != want {
					t.Errorf("%s: %d %s, want %d", name, st, raw, want)
					continue
				}
				if !ok && (!strings.Contains(raw, `"code":"forbidden"`) || strings.Contains(raw, owner) && op == "read") {
					t.Errorf("%s: refusal %s: want code forbidden and nothing revealed", name, raw)
				}
				// What the store holds now.
				after := s.status(t, res)
				lease, _ := after["lease"].(map[string]any)
				switch op {
				case "acquire":
					if got := lease != nil; got != ok {
						t.Errorf("%s: lease taken %v, want %v: %v", name, got, ok, after)
					}
				case "renew":
					if got := lease["ttl_seconds"] == float64(3600); got != ok {
						t.Errorf("%s: renewed %v, want %v: %v", name, got, ok, after)
					}
				case "release":
					if got := lease == nil; got != ok {
						t.Errorf("%s: released %v, want %v: %v", name, got, ok, after)
					}
				case "checkpoint":
					if got := after["checkpoint"] != nil; got != ok {
						t.Errorf("%s: checkpoint saved %v, want %v: %v", name, got, ok, after)
					}
				}
			}
		}
	}
	// Lists are filtered to each client's read prefixes.
	for client, tok := range clients {
		st, m, raw := s.do(t, tok, "GET", "/v1/leases", "")
		if st != 200 {
			t.Fatalf("%s list: %d %s", client, st, raw)
		}
		for _, l := range m["leases"].([]any) {
			res := l.(map[string]any)["resource"].(string)
			prefix := res[:strings.Index(res, ":")+1]
			if prefix == "job:" {
				prefix = res[:6]
			}
			if !may(client, prefix, "read") {
				t.Errorf("%s's list shows %s", client, res)
			}
		}
	}
	// The log names refused clients; the metric counts refusals by client.
	// Refusal lines are limited to leaseapi.RefusalLinesPerSecond: which
	// clients' refusals are logged depends on how many came in the same
	// second, so the log is checked for a refusal line naming a client,
	// and the metric (never limited) for pool-b's.
	if !regexp.MustCompile(`"msg":"lease API refusal".*"client":"[a-z-]+"`).MatchString(s.p.logs.String()) {
		t.Errorf("no refusal logged with the client's name\n%s", s.p.logs)
	}
	_, _, metrics := s.do(t, "", "GET", "/metrics", "")
	if !strings.Contains(metrics, `fencegate_api_refusals`) || !strings.Contains(metrics, `client="pool-b",code="forbidden"`) {
		t.Errorf("no refusal metric by client and code in\n%s", grepLines(metrics, "refusals"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestAccessAttackersSweep: pool-b, knowing pool-a's owner and token, and
// strangers with guessed tokens, try every trick; nothing is done and
// nothing is revealed.
func TestAccessAttackersSweep(t *testing.T) {
	s := newAccessSetup(t)
	st, m, raw := s.do(t, "tok-a", "POST", "/v1/leases/job:a:1/acquire", `{"owner":"pool-a/w1","ttl_seconds":600}`)
	if st != 200 {
		t.Fatalf("pool-a acquire: %d %s", st, raw)
	}
	tokA := int64(m["token"].(float64))
	if st, _, raw := s.do(t, "tok-a", "PUT", "/v1/leases/job:a:1/checkpoint", fmt.Sprintf(`{"owner":"pool-a/w1","token":%d,"state":{"secret":"pool-a-state"}}`, tokA)); st != 200 {
		t.Fatalf("pool-a checkpoint: %d %s", st, raw)
	}
	before := s.status(t, "job:a:1")
	held := fmt.Sprintf(`{"owner":"pool-a/w1","token":%d}`, tokA)
	names := []string{"job:a:1", "job%3Aa%3A1", "job%3aa%3a1", "JOB:A:1", "job:a:1%00", "job%253Aa%253A1", "job:b:..%2F..%2Fjob:a:1", "jo", "job:", "job:b", "job:a:", "job:a:1/../job:a:1"}
	for _, n := range names {
		for _, c := range []struct{ method, suffix, body string }{
			{"GET", "", ""},
			{"GET", "/checkpoint", ""},
			{"POST", "/release", held},
			{"POST", "/renew", held},
			{"PUT", "/checkpoint", fmt.Sprintf(`{"owner":"pool-a/w1","token":%d,"state":1}`, tokA)},
			{"POST", "/acquire", `{"owner":"pool-b/w","wait_seconds":0}`},
			{"POST", "/release", fmt.Sprintf(`{"owner":"pool-b/../pool-a/w1","token":%d}`, tokA)},
		} {
			st, _, raw := s.do(t, "cert:pool-b", c.method, "/v1/leases/"+n+c.suffix, c.body)
			if st == 200 {
				t.Errorf("pool-b %s %s%s: 200 %s", c.method, n, c.suffix, raw)
			}
			for _, secret := range []string{fmt.Sprintf(`"token":%d`, tokA), "pool-a/w1", "pool-a-state"} {
				if strings.Contains(raw, secret) {
					t.Errorf("pool-b %s %s%s: the answer reveals %q: %s", c.method, n, c.suffix, secret, raw)
				}
			}
		}
	}
	// Lists: nothing of pool-a's, whatever the prefix.
	for _, q := range []string{"", "?prefix=job:", "?prefix=job:a:", "?prefix=j", "?prefix=job%3Aa%3A", "?prefix=job:b:"} {
		st, _, raw := s.do(t, "cert:pool-b", "GET", "/v1/leases"+q, "")
		if st != 200 && st != 400 || strings.Contains(raw, "job:a:1") {
			t.Errorf("pool-b list%s: %d %s", q, st, raw)
		}
	}
	// Guessed and mangled tokens: 401 (or 429 once this address has spent
	// its failures), never served. Sent as strangers with the generic
	// certificate.
	guesses := []string{"tok-A", "TOK-A", "tok-", "tok-aa", access.HashToken("tok-a"), strings.Repeat("a", 64<<10), "tok-r tok-a", "Bearer tok-a"}
	saw429 := false
	for _, g := range guesses {
		st, _, raw := s.do(t, g, "GET", "/v1/leases/job:a:1", "")
		switch st {
		case 401:
			if !strings.Contains(raw, `"code":"unauthorized"`) {
				t.Errorf("guess %.20q: %s", g, raw)
			}
		case 429:
			saw429 = true
		case 431: // a token beyond the header size limit
		default:
			t.Errorf("guess %.20q: %d %s", g, st, raw)
		}
		if strings.Contains(raw, "pool-a") {
			t.Errorf("guess %.20q reveals the lease: %s", g, raw)
		}
	}
	// Nothing was done: the lease, its token and checkpoint are as they were.
	after := s.status(t, "job:a:1")
	if fmt.Sprint(after["lease"]) != fmt.Sprint(before["lease"]) || fmt.Sprint(after["checkpoint"]) != fmt.Sprint(before["checkpoint"]) || after["issued_token"] != before["issued_token"] {
		t.Fatalf("the sweep changed job:a:1:\nbefore %v\nafter  %v", before, after)
	}

	// Keep guessing (after the check above: the admin shares the address):
	// the limiter stops the sweep with 429 and Retry-After
	// (10 failures at once, then one per 6 s: 30 more cannot all pass).
	for i := 0; i < 30 && !saw429; i++ {
		st, _, _ := s.do(t, fmt.Sprintf("guess-%d", i), "GET", "/v1/leases/job:a:1", "")
		saw429 = st == 429
	}
	if !saw429 {
		t.Error("40 failed authentications from one address were never limited (429)")
	}
}

// TestAccessCertificateClientAndReload: a pool known by its SPIFFE
// certificate uses the CLI and fencegate run with no token; the access
// file is re-read on SIGHUP, and a file that does not parse keeps the one
// in force.
func TestAccessCertificateClientAndReload(t *testing.T) {
	s := newAccessSetup(t)
	certEnv := []string{"FENCEGATE_API_URL=" + s.api, "FENCEGATE_API_CA_FILE=" + s.set.CAFile,
		"FENCEGATE_API_CLIENT_CERT=" + s.poolBCert, "FENCEGATE_API_CLIENT_KEY=" + s.poolBKey}
	r := fg(t, certEnv, "", "lease", "acquire", "job:b:1", "--owner", "pool-b/w1")
	if r.code != 0 {
		t.Fatalf("pool-b by certificate: exit %d %s", r.code, r.stderr)
	}
	r = fg(t, certEnv, "", "lease", "acquire", "job:a:9", "--owner", "pool-b/w1")
	if r.code != 3 || r.problem(t)["code"] != "forbidden" {
		t.Fatalf("pool-b outside its prefix: exit %d %s", r.code, r.stderr)
	}
	// An Authorization header that holds no bearer token is refused, not
	// passed over for the certificate beside it.
	pair, err := tls.LoadX509KeyPair(s.poolBCert, s.poolBKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(s.set.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	certClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots}}}
	for _, h := range []string{"none", "", "Bearer ", "Bearer", "Basic cG9vbC1iOng="} {
		req, _ := http.NewRequest(http.MethodGet, s.api+"/v1/leases/job:b:1", nil)
		if h != "none" {
			req.Header["Authorization"] = []string{h} // sent, even empty
		}
		resp, err := certClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{true: http.StatusOK, false: http.StatusUnauthorized}[h == "none"]; resp.StatusCode != want {
			t.Fatalf("pool-b's certificate with Authorization %q: %d, want %d", h, resp.StatusCode, want)
		}
	}
	r = fg(t, append(certEnv, "PATH=/usr/bin:/bin"), "", "run", "--resource", "job:b:run", "--owner", "pool-b/runner", "--ttl", "5s", "--", "sh", "-c", `echo "$FENCING_OWNER"`)
	if r.code != 0 || r.stdout != "pool-b/runner\n" {
		t.Fatalf("fencegate run by certificate: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	// fencegate run with a bind_owner client and its default owner (HOST:PID:RANDOM): refused, exit 3.
	r = fg(t, append(certEnv, "PATH=/usr/bin:/bin"), "", "run", "--resource", "job:b:run2", "--", "true")
	if r.code != 3 || !strings.Contains(r.stderr, "forbidden") {
		t.Fatalf("fencegate run with an owner outside bind_owner: exit %d %q", r.code, r.stderr)
	}
	// A token client through the CLI.
	tokEnv := append([]string{"FENCEGATE_API_TOKEN=tok-a"}, s.clientEnvs...)
	if r := fg(t, tokEnv, "", "lease", "acquire", "job:a:1", "--owner", "pool-a"); r.code != 0 {
		t.Fatalf("pool-a by token: exit %d %s", r.code, r.stderr)
	}

	// Reload: a file that does not parse is refused, the policy stays.
	if err := os.WriteFile(s.file, []byte("clients:\n  - name: pool-a\n    token_sha256: not-a-hash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.p.waitLog(`"msg":"reload refused: the configuration in force stays","what":"FENCEGATE_ACCESS_FILE `+s.file, 1)
	// An unknown key: the log names it and its client.
	if err := os.WriteFile(s.file, []byte(accessFileWithUnknownKey), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.p.waitLog(`"msg":"reload refused: the configuration in force stays","what":"FENCEGATE_ACCESS_FILE `+s.file, 2)
	if want := `"error":"` + s.file + `: clients[1] (pool-b): unknown key \"bogus\"`; !strings.Contains(s.p.logs.String(), want) {
		t.Errorf("the refused reload's log line lacks %s\n%s", want, s.p.logs)
	}
	if r := fg(t, tokEnv, "", "lease", "status", "job:a:1"); r.code != 0 {
		t.Fatalf("after a refused reload, pool-a: exit %d %s", r.code, r.stderr)
	}
	// A good file takes over: pool-a is gone, pool-b now reads everything.
	doc := fmt.Sprintf("clients:\n  - name: pool-b\n    cert_uri: spiffe://test/pool-b\n    allow: [{prefix: \"\", ops: [read]}]\n  - name: admin\n    token_sha256: %s\n    allow: [{prefix: \"\", ops: [read]}]\n", access.HashToken("tok-admin"))
	if err := os.WriteFile(s.file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	s.p.waitLog(`"msg":"reloaded","what":"FENCEGATE_ACCESS_FILE `+s.file, 1)
	if r := fg(t, tokEnv, "", "lease", "status", "job:a:1"); r.code != 3 || r.problem(t)["code"] != "unauthorized" {
		t.Fatalf("after reload, removed pool-a: exit %d %s", r.code, r.stderr)
	}
	if r := fg(t, certEnv, "", "lease", "status", "job:a:1"); r.code != 0 || !strings.Contains(r.stdout, `"owner":"pool-a"`) {
		t.Fatalf("after reload, pool-b reads everything: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := fg(t, certEnv, "", "lease", "acquire", "job:b:2", "--owner", "pool-b"); r.code != 3 {
		t.Fatalf("after reload, pool-b may no longer acquire: exit %d %s", r.code, r.stdout)
	}
	if err := s.p.stop(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

// TestAccessCommands: fencegate access hash and token, and fencegate check
// on the access file.
func TestAccessCommands(t *testing.T) {
	r := fg(t, nil, "s3cret\n", "access", "hash")
	if r.code != 0 || r.stdout != access.HashToken("s3cret")+"\n" {
		t.Fatalf("access hash from stdin: %d %q", r.code, r.stdout)
	}
	if r := fg(t, nil, "", "access", "hash", "s3cret"); r.stdout != access.HashToken("s3cret")+"\n" {
		t.Fatalf("access hash TOKEN: %q", r.stdout)
	}
	if r := fg(t, nil, "", "access", "hash"); r.code != 2 {
		t.Fatalf("access hash without a token: exit %d", r.code)
	}
	for _, bad := range []string{"two words", "caf\u00e9", "tab\tin"} {
		if r := fg(t, nil, "", "access", "hash", bad); r.code != 2 || !strings.Contains(r.stderr, "no client could send it") || r.stdout != "" {
			t.Fatalf("access hash %q: exit %d %q %q", bad, r.code, r.stdout, r.stderr)
		}
	}
	// access token labels each value; the token_sha256 line is the access
	// file's own key, so it can be pasted as it is.
	r = fg(t, nil, "", "access", "token")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 {
		t.Fatalf("access token: %d %q", r.code, r.stdout)
	}
	tok, okTok := strings.CutPrefix(lines[0], "token: ")
	sum, okSum := strings.CutPrefix(lines[1], "token_sha256: ")
	if !okTok || !okSum || len(tok) < 40 || sum != access.HashToken(tok) {
		t.Fatalf("access token: want labelled lines token: and token_sha256:, got %q", r.stdout)
	}
	r = fg(t, nil, "", "access", "token", "--output", "json")
	var got struct {
		Token       string `json:"token"`
		TokenSHA256 string `json:"token_sha256"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil || len(got.Token) < 40 || got.TokenSHA256 != access.HashToken(got.Token) || got.Token == tok {
		t.Fatalf("access token --output json: %d %q %v", r.code, r.stdout, err)
	}
	if r := fg(t, nil, "", "access", "token", "--output", "yaml"); r.code != 2 || r.stdout != "" {
		t.Fatalf("access token --output yaml: exit %d %q", r.code, r.stdout)
	}

	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte(accessFileDoc()), 0o600)
	os.WriteFile(bad, []byte("clients:\n  - name: pool-a\n    token_sha256: "+access.HashToken("x")+"\n    allow: [{prefix: \"job:\", ops: [write]}]\n"), 0o600)
	r = fg(t, []string{"FENCEGATE_STORE=memory:", "FENCEGATE_ACCESS_FILE=" + good}, "", "check")
	if r.code != 0 || !strings.Contains(r.stdout, "lease API access: 5 clients") || !strings.Contains(r.stdout, "pool-b by cert_uri spiffe://test/pool-b") ||
		!strings.Contains(r.stdout, "warning: clients known by certificate") || strings.Contains(r.stdout, access.HashToken("tok-a")) {
		t.Fatalf("check of a good file: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = fg(t, []string{"FENCEGATE_STORE=memory:", "FENCEGATE_ACCESS_FILE=" + bad}, "", "check")
	if r.code != 2 || !strings.Contains(r.stderr, "FENCEGATE_ACCESS_FILE") || !strings.Contains(r.stderr, "clients[0] (pool-a)") || !strings.Contains(r.stderr, `"write"`) {
		t.Fatalf("check of a bad file: %d %s", r.code, r.stderr)
	}
	r = fg(t, []string{"FENCEGATE_STORE=memory:", "FENCEGATE_ACCESS_FILE=" + good, "FENCEGATE_API_TOKEN=x"}, "", "check")
	if r.code != 2 || !strings.Contains(r.stderr, "FENCEGATE_ACCESS_FILE") {
		t.Fatalf("check with both the file and a token: %d %s", r.code, r.stderr)
	}
	r = fg(t, []string{"FENCEGATE_STORE=memory:", "FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_ACCESS_FILE=" + bad}, "", "serve")
	if r.code == 0 || !strings.Contains(r.stderr, bad) {
		t.Fatalf("serve with a bad file: %d %s", r.code, r.stderr)
	}
	// An unknown key: named, with its client, in the YAML's terms (the
	// file is read by way of JSON, which the error does not mention).
	unknown := filepath.Join(dir, "unknown.yaml")
	os.WriteFile(unknown, []byte(accessFileWithUnknownKey), 0o600)
	for _, cmd := range []string{"check", "serve"} {
		r = fg(t, []string{"FENCEGATE_STORE=memory:", "FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_ACCESS_FILE=" + unknown}, "", cmd)
		if r.code != 2 || !strings.Contains(r.stderr, "FENCEGATE_ACCESS_FILE: "+unknown+`: clients[1] (pool-b): unknown key "bogus"`) ||
			strings.Contains(strings.ToLower(r.stderr), "json") {
			t.Errorf("%s of a file with an unknown key: exit %d %s", cmd, r.code, r.stderr)
		}
	}
}

// accessFileWithUnknownKey is an access file whose second client has a
// key the file does not know.
var accessFileWithUnknownKey = "clients:\n  - name: pool-a\n    token_sha256: " + access.HashToken("x") + "\n    allow: [{prefix: \"job:\", ops: [read]}]\n" +
	"  - name: pool-b\n    cert_dns: pool-b.test\n    bogus: true\n    allow: [{prefix: \"job:\", ops: [read]}]\n"
