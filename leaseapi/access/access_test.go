package access_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/leaseapi/access"
)

const twoPools = `
clients:
  - name: pool-a
    token_sha256: ` + "%A%" + `
    allow:
      - {prefix: "job:a:", ops: [acquire, renew, release, checkpoint, read]}
    bind_owner: true
  - name: reporting
    cert_uri: spiffe://corp/ns/ops/sa/reporting
    cert_dns: Reporting.Ops.Svc
    allow:
      - {prefix: "", ops: [read]}
  - name: both
    token_sha256: ` + "%B%" + `
    allow:
      - {prefix: "x:", ops: [read]}
      - {prefix: "x:y", ops: [read, acquire]}
      - {prefix: "w", ops: [acquire]}
`

func policy(t *testing.T) *access.Policy {
	t.Helper()
	doc := strings.NewReplacer("%A%", access.HashToken("token-a"), "%B%", access.HashToken("token-b")).Replace(twoPools)
	p, err := access.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestByToken(t *testing.T) {
	p := policy(t)
	for tok, want := range map[string]string{"token-a": "pool-a", "token-b": "both", "token-A": "", "token-a ": "", "": "", strings.Repeat("x", 1<<16): ""} {
		c, ok := p.ByToken(tok)
		switch {
		case want == "" && ok:
			t.Errorf("token %.20q: found %s, want none", tok, c.Name)
		case want != "" && (!ok || c.Name != want):
			t.Errorf("token %.20q: found %v, want %s", tok, c, want)
		}
	}
}

func TestByCertificate(t *testing.T) {
	p := policy(t)
	uri := func(s string) *url.URL { u, _ := url.Parse(s); return u }
	for _, tc := range []struct {
		cert *x509.Certificate
		want string
	}{
		{&x509.Certificate{URIs: []*url.URL{uri("spiffe://corp/ns/ops/sa/reporting")}}, "reporting"},
		{&x509.Certificate{DNSNames: []string{"reporting.ops.svc"}}, "reporting"},
		{&x509.Certificate{DNSNames: []string{"REPORTING.OPS.SVC"}}, "reporting"},
		{&x509.Certificate{URIs: []*url.URL{uri("spiffe://corp/ns/ops/sa/reporting2")}}, ""},
		{&x509.Certificate{URIs: []*url.URL{uri("spiffe://corp/ns/ops/sa/Reporting")}}, ""},
		{&x509.Certificate{DNSNames: []string{"reporting.ops.svc.evil"}}, ""},
		// A common name is never a credential.
		{&x509.Certificate{Subject: pkix.Name{CommonName: "reporting.ops.svc"}}, ""},
		// Several SANs naming the same client: that client.
		{&x509.Certificate{URIs: []*url.URL{uri("spiffe://corp/ns/ops/sa/reporting")}, DNSNames: []string{"x.example", "Reporting.ops.svc"}}, "reporting"},
	} {
		c, ok := p.ByCertificate(tc.cert)
		if ok {
			if c.Name != tc.want {
				t.Errorf("%v %v: found %s, want %q", tc.cert.URIs, tc.cert.DNSNames, c.Name, tc.want)
			}
		} else if tc.want != "" {
			t.Errorf("%v %v: found none, want %s", tc.cert.URIs, tc.cert.DNSNames, tc.want)
		}
	}
	if !p.HasCertClients() {
		t.Error("HasCertClients() = false")
	}
}

// A certificate whose SANs name two clients is no client's: which one it
// is would hang on the order and kind of its SANs, which the file does not
// show.
func TestByCertificateNamingTwoClients(t *testing.T) {
	doc := `clients:
  - {name: reporting, cert_dns: reporting.ops.svc, allow: [{prefix: "", ops: [read]}]}
  - {name: admin, cert_uri: "spiffe://corp/admin", allow: [{prefix: "", ops: [acquire, read]}]}
  - {name: ops, cert_dns: ops.svc, allow: [{prefix: "", ops: [read]}]}
`
	p, err := access.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := url.Parse("spiffe://corp/admin")
	for _, cert := range []*x509.Certificate{
		{URIs: []*url.URL{admin}, DNSNames: []string{"reporting.ops.svc"}},
		{DNSNames: []string{"reporting.ops.svc", "ops.svc"}},
		{DNSNames: []string{"ops.svc", "REPORTING.ops.svc"}},
	} {
		if c, ok := p.ByCertificate(cert); ok {
			t.Errorf("%v %v: found %s, want none (two clients named)", cert.URIs, cert.DNSNames, c.Name)
		}
	}
}

func TestAllowsByPrefixAndOp(t *testing.T) {
	p := policy(t)
	a, _ := p.ByToken("token-a")
	b, _ := p.ByToken("token-b")
	for _, tc := range []struct {
		c        *access.Client
		op       access.Op
		resource string
		want     bool
	}{
		{a, access.Acquire, "job:a:1", true},
		{a, access.Read, "job:a:", true},
		{a, access.Acquire, "job:a", false},
		{a, access.Acquire, "job:b:1", false},
		{a, access.Acquire, "JOB:a:1", false},
		{a, access.Acquire, "jo", false},
		{b, access.Read, "x:1", true},
		{b, access.Acquire, "x:1", false},
		{b, access.Acquire, "x:y", true},
		{b, access.Acquire, "x:yz", true},
		{b, access.Release, "x:y", false},
		{b, access.Acquire, "w", true},
		{b, access.Read, "w", false},
	} {
		if got := tc.c.Allows(tc.op, tc.resource); got != tc.want {
			t.Errorf("%s %s %q: %v, want %v", tc.c.Name, tc.op, tc.resource, got, tc.want)
		}
	}
	if got := strings.Join(b.ReadPrefixes(), ","); got != "x:" {
		t.Errorf("ReadPrefixes: %q, want x: (x:y is under it)", got)
	}
}

func TestOwnerBinding(t *testing.T) {
	p := policy(t)
	a, _ := p.ByToken("token-a")
	b, _ := p.ByToken("token-b")
	for owner, want := range map[string]bool{"pool-a": true, "pool-a/w1": true, "pool-a/": true, "pool-ab": false, "pool-a-w1": false, "pool-b/pool-a": false, "": false, "POOL-A": false} {
		if got := a.OwnerAllowed(owner); got != want {
			t.Errorf("bind_owner pool-a, owner %q: %v, want %v", owner, got, want)
		}
	}
	if !b.OwnerAllowed("anyone") {
		t.Error("a client without bind_owner may name any owner")
	}
}

func TestParseRefusesMistakes(t *testing.T) {
	h := access.HashToken("t")
	for name, doc := range map[string]string{
		"empty":                   ``,
		"no clients key":          `{}`,
		"unknown key":             "clients:\n  - name: a\n    token_sha256: " + h + "\n    allow: [{prefix: '', ops: [read]}]\n    bind_ownr: true\n",
		"no name":                 "clients:\n  - token_sha256: " + h + "\n    allow: [{prefix: '', ops: [read]}]\n",
		"bad name":                "clients:\n  - name: a/b\n    token_sha256: " + h + "\n    allow: [{prefix: '', ops: [read]}]\n",
		"no credential":           "clients:\n  - name: a\n    allow: [{prefix: '', ops: [read]}]\n",
		"short hash":              "clients:\n  - name: a\n    token_sha256: abc\n    allow: [{prefix: '', ops: [read]}]\n",
		"token not hash":          "clients:\n  - name: a\n    token_sha256: my-secret-token\n    allow: [{prefix: '', ops: [read]}]\n",
		"no allow":                "clients:\n  - name: a\n    token_sha256: " + h + "\n",
		"no prefix":               "clients:\n  - name: a\n    token_sha256: " + h + "\n    allow: [{ops: [read]}]\n",
		"bad prefix":              "clients:\n  - name: a\n    token_sha256: " + h + "\n    allow: [{prefix: 'job/', ops: [read]}]\n",
		"unknown op":              "clients:\n  - name: a\n    token_sha256: " + h + "\n    allow: [{prefix: '', ops: [write]}]\n",
		"no ops":                  "clients:\n  - name: a\n    token_sha256: " + h + "\n    allow: [{prefix: '', ops: []}]\n",
		"duplicate name":          "clients:\n  - name: a\n    token_sha256: " + h + "\n    allow: [{prefix: '', ops: [read]}]\n  - name: a\n    cert_dns: x\n    allow: [{prefix: '', ops: [read]}]\n",
		"duplicate token":         "clients:\n  - name: a\n    token_sha256: " + h + "\n    allow: [{prefix: '', ops: [read]}]\n  - name: b\n    token_sha256: " + strings.ToUpper(h) + "\n    allow: [{prefix: '', ops: [read]}]\n",
		"duplicate cert_uri":      "clients:\n  - name: a\n    cert_uri: spiffe://x/a\n    allow: [{prefix: '', ops: [read]}]\n  - name: b\n    cert_uri: spiffe://x/a\n    allow: [{prefix: '', ops: [read]}]\n",
		"cert_uri in capitals":    "clients:\n  - name: a\n    cert_uri: SPIFFE://x/a\n    allow: [{prefix: '', ops: [read]}]\n",
		"cert_uri empty fragment": "clients:\n  - name: a\n    cert_uri: spiffe://x/a#\n    allow: [{prefix: '', ops: [read]}]\n",
		"not yaml":                "clients: [",
	} {
		if _, err := access.Parse([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "t\n") || strings.Contains(strings.ToLower(err.Error()), "json") {
			t.Errorf("%s: %v (a YAML file's error speaks of YAML, on one line)", name, err)
		}
	}
	// An empty list is a valid policy that lets no one in.
	if p, err := access.Parse([]byte("clients: []\n")); err != nil || len(p.Clients()) != 0 {
		t.Errorf("clients: []: %v %v", p, err)
	}
}

// TestParseErrorsNameTheKeyAndClient: a key or value the file does not
// allow is reported in the YAML's terms: which key, under which client (by
// position, and name when it has one) and permission.
func TestParseErrorsNameTheKeyAndClient(t *testing.T) {
	h := access.HashToken("t")
	good := "  - name: a\n    token_sha256: " + h + "\n    allow: [{prefix: '', ops: [read]}]\n"
	for doc, want := range map[string]string{
		"clients:\n" + good + "  - name: b\n    cert_dns: x\n    allow: [{prefix: '', ops: [read]}]\n    bogus: true\n": `clients[1] (b): unknown key "bogus" (a client's keys are name, token_sha256, cert_uri, cert_dns, allow, bind_owner)`,
		"clients:\n  - cert_dns: x\n    allow: [{prefix: '', ops: [read]}]\n    zz: 1\n    bogus: 2\n":                  `clients[0]: unknown keys "bogus", "zz"`,
		"clients:\n  - name: a\n    cert_dns: x\n    allow: [{prefix: '', ops: [read], opz: [read]}]\n":                 `clients[0] (a): allow[0]: unknown key "opz" (a permission's keys are prefix, ops)`,
		"client:\n" + good: `unknown key "client" at the top (the only top-level key is clients)`,
		"clients:\n" + good + "    bind_owner: maybe\n": `clients[0] (a): bind_owner: want true or false, not a string`,
		// An empty value (a template's unset variable) is not false: the
		// binding would be off without a word.
		"clients:\n" + good + "    bind_owner:\n":                                                                     `clients[0] (a): bind_owner: want true or false, not an empty value`,
		"clients:\n" + good + "    bind_owner: ~\n":                                                                   `clients[0] (a): bind_owner: want true or false, not an empty value`,
		"clients:\n  - name: a\n    cert_dns: x\n    allow: [{prefix: null, ops: [read]}]\n":                          `clients[0] (a): allow[0]: prefix: want a string, not an empty value`,
		"clients:\n  - name: a\n    cert_dns:\n    token_sha256: " + h + "\n    allow: [{prefix: '', ops: [read]}]\n": `clients[0] (a): cert_dns: want a string, not an empty value`,
		"clients:\n  - name: a\n    cert_dns: x\n    allow: [{prefix: '', ops: read}]\n":                              `clients[0] (a): allow[0]: ops: want a list of operations, not a string`,
		"clients:\n  - name: a\n    cert_dns: x\n    allow: [{prefix: '', ops: [read, 5]}]\n":                         `clients[0] (a): allow[0]: ops[1]: want one of acquire, renew, release, checkpoint, read, not a number`,
		"clients:\n  - name: a\n    cert_dns: x\n    allow: {prefix: '', ops: [read]}\n":                              `clients[0] (a): allow: want a list of permissions`,
		"clients:\n  - name: [a]\n":            `clients[0]: name: want a string, not a list`,
		"clients:\n  - a\n":                    `clients[0]: want a mapping with the keys name, token_sha256`,
		"clients: a\n":                         `clients: want a list of clients, not a string`,
		"- a\n":                                `want a mapping with a clients: list at the top, not a list`,
		"clients:\n  - name: a\n    name: b\n": `yaml: line 3: key "name" already set in map`,
	} {
		_, err := access.Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", doc, err, want)
		}
	}
}

func TestFileReloadKeepsThePolicyInForce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.yaml")
	write := func(doc string) {
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("clients:\n  - name: a\n    token_sha256: " + access.HashToken("ta") + "\n    allow: [{prefix: '', ops: [read]}]\n")
	f, err := access.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	write("clients:\n  - name: a\n    token_sha256: nothex\n")
	if err := f.Reload(); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("reload of a bad file: %v, want an error naming %s", err, path)
	}
	if _, ok := f.Policy().ByToken("ta"); !ok {
		t.Fatal("a failed reload replaced the policy in force")
	}
	write("clients:\n  - name: b\n    token_sha256: " + access.HashToken("tb") + "\n    allow: [{prefix: '', ops: [read]}]\n")
	if err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Policy().ByToken("ta"); ok {
		t.Fatal("after reload, the removed client is still known")
	}
	if c, ok := f.Policy().ByToken("tb"); !ok || c.Name != "b" {
		t.Fatal("after reload, the new client is not known")
	}
}

func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := access.NewLimiter(3, 10*time.Second, func() time.Time { return now })
	for i := range 3 {
		if _, blocked := l.Blocked("a"); blocked {
			t.Fatalf("blocked after %d failures of a burst of 3", i)
		}
		l.Fail("a")
	}
	wait, blocked := l.Blocked("a")
	if !blocked || wait != 10*time.Second {
		t.Fatalf("after the burst: blocked %v, wait %v; want blocked for 10s", blocked, wait)
	}
	if _, blocked := l.Blocked("b"); blocked {
		t.Fatal("another address is blocked")
	}
	now = now.Add(4 * time.Second)
	if wait, blocked := l.Blocked("a"); !blocked || wait != 6*time.Second {
		t.Fatalf("4s later: %v %v; want blocked for 6s", blocked, wait)
	}
	now = now.Add(6 * time.Second)
	if _, blocked := l.Blocked("a"); blocked {
		t.Fatal("not unblocked after one refill")
	}
	l.Fail("a")
	if _, blocked := l.Blocked("a"); !blocked {
		t.Fatal("one refill allows one failure only")
	}
	now = now.Add(time.Hour)
	for range 3 {
		if _, blocked := l.Blocked("a"); blocked {
			t.Fatal("refill beyond the burst missing")
		}
		l.Fail("a")
	}
	if _, blocked := l.Blocked("a"); !blocked {
		t.Fatal("refill went beyond the burst")
	}
}

// Fail spends a failure only when one is left, and otherwise says how
// long to wait, as Blocked does: calls that all passed Blocked at once
// get no more failures than the burst.
func TestLimiterFailReportsSpent(t *testing.T) {
	now := time.Unix(1000, 0)
	l := access.NewLimiter(2, 10*time.Second, func() time.Time { return now })
	for i := range 2 {
		if _, blocked := l.Fail("a"); blocked {
			t.Fatalf("failure %d of a burst of 2 refused", i+1)
		}
	}
	for range 5 {
		if wait, blocked := l.Fail("a"); !blocked || wait != 10*time.Second {
			t.Fatalf("a failure past the burst: blocked %v, wait %v; want blocked for 10s", blocked, wait)
		}
	}
	// The refused ones spent nothing: one refill later, one failure again.
	now = now.Add(10 * time.Second)
	if _, blocked := l.Fail("a"); blocked {
		t.Fatal("after a refill, the failure is refused")
	}
}
