package access_test

import (
	"strings"
	"testing"

	"github.com/fencegate/fencegate/leaseapi/access"
)

// FuzzParse: any input either fails to parse or gives a policy whose every
// client has a valid name, a credential and permissions, and whose token
// lookup finds no client for a token none was given.
func FuzzParse(f *testing.F) {
	f.Add([]byte(twoPools))
	f.Add([]byte("clients: []\n"))
	f.Add([]byte("clients:\n  - name: a\n    cert_dns: X.y\n    allow: [{prefix: '', ops: [read]}]\n"))
	f.Add([]byte("clients:\n  - name: a\n    token_sha256: " + access.HashToken("t") + "\n    allow: [{prefix: 'job:', ops: [acquire, read]}]\n    bind_owner: true\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := access.Parse(data)
		if err != nil {
			return
		}
		for _, c := range p.Clients() {
			if c.Name == "" || strings.Contains(c.Name, "/") {
				t.Fatalf("client with name %q accepted", c.Name)
			}
			d := c.Describe()
			if !strings.Contains(d, " by ") {
				t.Fatalf("client %s without a credential: %s", c.Name, d)
			}
			if c.OwnerAllowed(c.Name+"x") && c.BindOwner {
				t.Fatalf("bind_owner client %s may act as %sx", c.Name, c.Name)
			}
		}
		if c, ok := p.ByToken("no client was given this token, 4f1c"); ok {
			t.Fatalf("an unknown token found client %s", c.Name)
		}
	})
}
