// Package access decides who may do what on the lease API: a policy of
// clients, each known by the SHA-256 of a bearer token or by a URI or DNS
// subject alternative name of a verified client certificate, and each
// allowed some operations on resources under some name prefixes, with an
// optional binding of the owners it may name to its own name.
//
// The policy is read from a YAML file (FENCEGATE_ACCESS_FILE):
//
//	clients:
//	  - name: worker-pool-a
//	    token_sha256: 9f86d0…   # hex SHA-256 of the bearer token; the token itself is never stored
//	    allow:
//	      - {prefix: "job:", ops: [acquire, renew, release, checkpoint, read]}
//	    bind_owner: true        # owners must be "worker-pool-a" or start with "worker-pool-a/"
//	  - name: reporting
//	    cert_uri: spiffe://corp/ns/ops/sa/reporting   # or cert_dns: reporting.ops.svc
//	    allow:
//	      - {prefix: "", ops: [read]}
//
// Prefixes are plain byte prefixes of resource names, matched after the
// name is percent-decoded and validated: "job:" covers "job:1" and "job:",
// not "job" nor "JOB:1". A File holds the policy in force and replaces it
// whole on Reload, only when the new file parses.
package access

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"sigs.k8s.io/yaml"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/internal/configfile"
)

// Op is an operation of the lease API a permission grants.
type Op string

// The operations. Read covers status, checkpoint reads and lists.
const (
	Acquire    Op = "acquire"
	Renew      Op = "renew"
	Release    Op = "release"
	Checkpoint Op = "checkpoint"
	Read       Op = "read"
)

// Ops lists every operation.
var Ops = []Op{Acquire, Renew, Release, Checkpoint, Read}

// MaxNameBytes bounds a client's name, which appears in logs and metric
// labels.
const MaxNameBytes = 100

// Client is one known client of the policy. Its fields are read-only once
// the policy is built.
type Client struct {
	// Name names the client in logs, metrics and, with BindOwner, owners.
	Name string
	// BindOwner requires every owner the client names to be Name or to
	// begin with Name + "/".
	BindOwner bool

	tokenSum [sha256.Size]byte
	hasToken bool
	certURI  string
	certDNS  string // lower case
	allow    []Permission
}

// Describe is a one-line summary of the client for people (fencegate
// check): its name, credentials (never the hash) and permissions.
func (c *Client) Describe() string {
	var creds []string
	if c.hasToken {
		creds = append(creds, "token")
	}
	if c.certURI != "" {
		creds = append(creds, "cert_uri "+c.certURI)
	}
	if c.certDNS != "" {
		creds = append(creds, "cert_dns "+c.certDNS)
	}
	var perms []string
	for _, p := range c.allow {
		ops := make([]string, len(p.Ops))
		for i, op := range p.Ops {
			ops[i] = string(op)
		}
		perms = append(perms, fmt.Sprintf("%q: %s", p.Prefix, strings.Join(ops, ",")))
	}
	s := c.Name + " by " + strings.Join(creds, ", ") + "; " + strings.Join(perms, "; ")
	if c.BindOwner {
		s += "; owners " + c.Name + " and " + c.Name + "/..."
	}
	return s
}

// Permission grants Ops on the resources whose names begin with Prefix.
type Permission struct {
	Prefix string
	Ops    []Op
}

// Allows reports whether the client may do op on resource.
func (c *Client) Allows(op Op, resource string) bool {
	for _, p := range c.allow {
		if strings.HasPrefix(resource, p.Prefix) && slices.Contains(p.Ops, op) {
			return true
		}
	}
	return false
}

// ReadPrefixes are the prefixes under which the client may read, none of
// them under another (a list is filtered to these).
func (c *Client) ReadPrefixes() []string {
	var ps []string
	for _, p := range c.allow {
		if slices.Contains(p.Ops, Read) {
			ps = append(ps, p.Prefix)
		}
	}
	slices.Sort(ps)
	var out []string
	for _, p := range ps {
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]) {
			continue // covered by a shorter prefix
		}
		out = append(out, p)
	}
	return out
}

// OwnerAllowed reports whether the client may name owner: always, unless
// BindOwner, then only its own name or a name beginning with name + "/".
func (c *Client) OwnerAllowed(owner string) bool {
	if !c.BindOwner {
		return true
	}
	return owner == c.Name || strings.HasPrefix(owner, c.Name+"/")
}

// Policy is a parsed access file. It is immutable and safe for concurrent
// use.
type Policy struct {
	clients []*Client
	byURI   map[string]*Client
	byDNS   map[string]*Client
}

// Clients returns the policy's clients, in file order.
func (p *Policy) Clients() []*Client { return slices.Clone(p.clients) }

// ByToken finds the client whose token hash is the SHA-256 of token. Every
// client's hash is compared, in constant time, whatever matches: the time
// taken depends on the token's length and the number of clients only.
func (p *Policy) ByToken(token string) (*Client, bool) {
	return p.ByTokenSum(sha256.Sum256([]byte(token)))
}

// ByTokenSum is ByToken for the SHA-256 of the token, for a caller that
// keeps the hash (as the lease API does for the connection a token
// authenticated on).
func (p *Policy) ByTokenSum(sum [sha256.Size]byte) (*Client, bool) {
	var found *Client
	for _, c := range p.clients {
		eq := subtle.ConstantTimeCompare(sum[:], c.tokenSum[:]) & boolInt(c.hasToken)
		if eq == 1 && found == nil {
			found = c
		}
	}
	return found, found != nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ByCertificate finds the client named by the URI and DNS SANs of cert,
// which the TLS handshake verified. A certificate whose SANs name two or
// more clients is none of them: which it would be would hang on the order
// and kind of its SANs, which the access file does not show, and a
// certificate issued for one client with a name of another would act as
// the one its issuer listed first.
func (p *Policy) ByCertificate(cert *x509.Certificate) (*Client, bool) {
	var found *Client
	several := false
	note := func(c *Client, ok bool) {
		switch {
		case !ok:
		case found == nil:
			found = c
		case found != c:
			several = true
		}
	}
	for _, u := range cert.URIs {
		c, ok := p.byURI[u.String()]
		note(c, ok)
	}
	for _, d := range cert.DNSNames {
		c, ok := p.byDNS[strings.ToLower(d)]
		note(c, ok)
	}
	if several {
		return nil, false
	}
	return found, found != nil
}

// HasCertClients reports whether any client is known by a certificate,
// which needs a mutual-TLS listener.
func (p *Policy) HasCertClients() bool { return len(p.byURI)+len(p.byDNS) > 0 }

// HashToken is the hex SHA-256 of token, as token_sha256 wants it.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// clientDoc is one entry of the file's clients: list.
type clientDoc struct {
	Name        string
	TokenSHA256 string
	CertURI     string
	CertDNS     string
	Allow       []permissionDoc
	BindOwner   bool
}

// permissionDoc is one entry of a client's allow: list.
type permissionDoc struct {
	Prefix *string
	Ops    []Op
}

// Parse reads a policy from YAML. Unknown keys, values of the wrong kind,
// a client without a name or credential, a repeated name or credential, a
// malformed hash, prefix or operation are errors naming the client (by its
// position in clients:, and its name when it has one) and the key at
// fault, in the file's terms.
func Parse(data []byte) (*Policy, error) {
	// sigs.k8s.io/yaml turns the YAML into JSON (strictly: a key repeated
	// in a mapping is an error); the JSON is then read here key by key,
	// rather than into structs by encoding/json, whose errors speak of
	// JSON and Go ("json: unknown field", "Go struct field") and name no
	// client.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not a valid access file: %s", yamlError(err))
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, fmt.Errorf("not a valid access file: want a mapping with a clients: list at the top, not %s", kind(js))
	}
	if extra := unknownKeys(top, fileKeys); extra != "" {
		return nil, fmt.Errorf("not a valid access file: %s at the top (the only top-level key is clients)", extra)
	}
	rawClients, ok := top["clients"]
	if len(bytes.TrimSpace(data)) == 0 || !ok || isNull(rawClients) {
		return nil, errors.New("no clients: the file must have a clients: list (an empty list [] lets no one in)")
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(rawClients, &entries); err != nil {
		return nil, fmt.Errorf("clients: want a list of clients, not %s", kind(rawClients))
	}
	p := &Policy{byURI: map[string]*Client{}, byDNS: map[string]*Client{}}
	names := map[string]bool{}
	tokens := map[[sha256.Size]byte]string{}
	var errs []error
	for i, raw := range entries {
		cd, err := decodeClient(raw)
		where := fmt.Sprintf("clients[%d]", i)
		if cd.Name != "" {
			where += fmt.Sprintf(" (%s)", cd.Name)
		}
		var c *Client
		if err == nil {
			c, err = parseClient(cd)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		if names[c.Name] {
			errs = append(errs, fmt.Errorf("%s: the name is used by another client", where))
		}
		names[c.Name] = true
		if c.hasToken {
			if other, dup := tokens[c.tokenSum]; dup {
				errs = append(errs, fmt.Errorf("%s: the same token_sha256 as client %s", where, other))
			}
			tokens[c.tokenSum] = c.Name
		}
		if c.certURI != "" {
			if other, dup := p.byURI[c.certURI]; dup {
				errs = append(errs, fmt.Errorf("%s: the same cert_uri as client %s", where, other.Name))
			}
			p.byURI[c.certURI] = c
		}
		if c.certDNS != "" {
			if other, dup := p.byDNS[c.certDNS]; dup {
				errs = append(errs, fmt.Errorf("%s: the same cert_dns as client %s", where, other.Name))
			}
			p.byDNS[c.certDNS] = c
		}
		p.clients = append(p.clients, c)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// The keys of the file, of a client and of a permission, in the order
// docs/access.md gives them.
var (
	fileKeys       = []string{"clients"}
	clientKeys     = []string{"name", "token_sha256", "cert_uri", "cert_dns", "allow", "bind_owner"}
	permissionKeys = []string{"prefix", "ops"}
)

// decodeClient reads one entry of clients:. Its name is set in the result
// as soon as it is read, even when the entry is refused, so that the error
// can name the client.
func decodeClient(raw json.RawMessage) (clientDoc, error) {
	var cd clientDoc
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return cd, fmt.Errorf("want a mapping with the keys %s, not %s", strings.Join(clientKeys, ", "), kind(raw))
	}
	nameErr := decodeValue(m, "name", &cd.Name, "a string")
	if extra := unknownKeys(m, clientKeys); extra != "" {
		return cd, fmt.Errorf("%s (a client's keys are %s)", extra, strings.Join(clientKeys, ", "))
	}
	if nameErr != nil {
		return cd, nameErr
	}
	for _, f := range []struct {
		key  string
		into any
		want string
	}{
		{"token_sha256", &cd.TokenSHA256, "a string"},
		{"cert_uri", &cd.CertURI, "a string"},
		{"cert_dns", &cd.CertDNS, "a string"},
		{"bind_owner", &cd.BindOwner, "true or false"},
	} {
		if err := decodeValue(m, f.key, f.into, f.want); err != nil {
			return cd, err
		}
	}
	var allow []json.RawMessage
	if err := decodeValue(m, "allow", &allow, "a list of permissions ({prefix: ..., ops: [...]})"); err != nil {
		return cd, err
	}
	for j, raw := range allow {
		var pm map[string]json.RawMessage
		if err := json.Unmarshal(raw, &pm); err != nil || pm == nil {
			return cd, fmt.Errorf("allow[%d]: want a mapping with the keys %s, not %s", j, strings.Join(permissionKeys, ", "), kind(raw))
		}
		if extra := unknownKeys(pm, permissionKeys); extra != "" {
			return cd, fmt.Errorf("allow[%d]: %s (a permission's keys are %s)", j, extra, strings.Join(permissionKeys, ", "))
		}
		var pd permissionDoc
		if err := decodeValue(pm, "prefix", &pd.Prefix, "a string"); err != nil {
			return cd, fmt.Errorf("allow[%d]: %w", j, err)
		}
		var ops []json.RawMessage
		if err := decodeValue(pm, "ops", &ops, "a list of operations"); err != nil {
			return cd, fmt.Errorf("allow[%d]: %w", j, err)
		}
		for k, raw := range ops {
			var op Op
			if err := json.Unmarshal(raw, &op); err != nil {
				return cd, fmt.Errorf("allow[%d]: ops[%d]: want one of acquire, renew, release, checkpoint, read, not %s", j, k, kind(raw))
			}
			pd.Ops = append(pd.Ops, op)
		}
		cd.Allow = append(cd.Allow, pd)
	}
	return cd, nil
}

// decodeValue reads m[key], if present, into into; a value of another
// kind is an error naming key and saying what it wants. So is an empty
// value (`key:` with nothing after it, ~, null: what a template writes
// for a variable left unset), which JSON would decode as nothing at all:
// bind_owner would read as false, a binding silently off.
func decodeValue(m map[string]json.RawMessage, key string, into any, want string) error {
	raw, ok := m[key]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, into); err != nil || isNull(raw) {
		return fmt.Errorf("%s: want %s, not %s", key, want, kind(raw))
	}
	return nil
}

// unknownKeys names the keys of m not in known, sorted ("unknown key
// \"bogus\""), or is "" when there are none.
func unknownKeys(m map[string]json.RawMessage, known []string) string {
	var extra []string
	for k := range m {
		if !slices.Contains(known, k) {
			extra = append(extra, strconv.Quote(k))
		}
	}
	switch len(extra) {
	case 0:
		return ""
	case 1:
		return "unknown key " + extra[0]
	}
	slices.Sort(extra)
	return "unknown keys " + strings.Join(extra, ", ")
}

// kind says, in YAML's terms, what kind of value the JSON raw is.
func kind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "a mapping"
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "an empty value"
	}
	return "a number"
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// yamlError is a YAML syntax error of sigs.k8s.io/yaml without its
// mention of JSON, on one line.
func yamlError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
	msg = strings.Replace(msg, "unmarshal errors:", "", 1)
	return strings.Join(strings.Fields(strings.ReplaceAll(msg, ":\n", ": ")), " ")
}

func parseClient(cd clientDoc) (*Client, error) {
	if err := validateName(cd.Name); err != nil {
		return nil, fmt.Errorf("name: %w", err)
	}
	c := &Client{Name: cd.Name, BindOwner: cd.BindOwner}
	if cd.TokenSHA256 != "" {
		b, err := hex.DecodeString(cd.TokenSHA256)
		if err != nil || len(b) != sha256.Size {
			return nil, errors.New("token_sha256: want the 64 hex digits of a SHA-256 ('fencegate access hash' prints it for a token)")
		}
		copy(c.tokenSum[:], b)
		c.hasToken = true
	}
	if cd.CertURI != "" {
		if strings.ContainsFunc(cd.CertURI, func(r rune) bool { return r <= ' ' || r > '~' }) || !strings.Contains(cd.CertURI, ":") {
			return nil, fmt.Errorf("cert_uri %q: want a URI such as spiffe://trust-domain/path", cd.CertURI)
		}
		// A certificate's URIs are known only as Go's x509 parsed them
		// (ByCertificate), which writes some spellings another way (the
		// scheme in lower case, an empty fragment dropped): a cert_uri in
		// another spelling would match a URI other than the one written.
		if u, err := url.Parse(cd.CertURI); err != nil || u.String() != cd.CertURI {
			if err != nil {
				return nil, fmt.Errorf("cert_uri %q: %w", cd.CertURI, err)
			}
			return nil, fmt.Errorf("cert_uri %q: certificates' URIs are compared in their parsed form; write it %q", cd.CertURI, u.String())
		}
		c.certURI = cd.CertURI
	}
	if cd.CertDNS != "" {
		if strings.ContainsFunc(cd.CertDNS, func(r rune) bool { return r <= ' ' || r > '~' || r == '/' }) {
			return nil, fmt.Errorf("cert_dns %q: want a DNS name such as reporting.ops.svc", cd.CertDNS)
		}
		c.certDNS = strings.ToLower(cd.CertDNS)
	}
	if !c.hasToken && c.certURI == "" && c.certDNS == "" {
		return nil, errors.New("no credential: give token_sha256, cert_uri or cert_dns")
	}
	if len(cd.Allow) == 0 {
		return nil, errors.New("allow: no permissions (a client that may do nothing need not be listed)")
	}
	for j, pd := range cd.Allow {
		if pd.Prefix == nil {
			return nil, fmt.Errorf("allow[%d]: prefix is required (\"\" for every resource)", j)
		}
		if *pd.Prefix != "" {
			if err := fencing.ValidateResourcePrefix(*pd.Prefix); err != nil {
				return nil, fmt.Errorf("allow[%d]: prefix %q: %v", j, *pd.Prefix, err)
			}
		}
		if len(pd.Ops) == 0 {
			return nil, fmt.Errorf("allow[%d]: ops: none listed (want some of acquire, renew, release, checkpoint, read)", j)
		}
		for _, op := range pd.Ops {
			if !slices.Contains(Ops, op) {
				return nil, fmt.Errorf("allow[%d]: ops: %q is not one of acquire, renew, release, checkpoint, read", j, op)
			}
		}
		c.allow = append(c.allow, Permission{Prefix: *pd.Prefix, Ops: slices.Clone(pd.Ops)})
	}
	return c, nil
}

// validateName accepts 1 to MaxNameBytes bytes of A-Z a-z 0-9 . _ -: a
// name fit for an owner prefix, a log field and a metric label.
func validateName(n string) error {
	if n == "" {
		return errors.New("required")
	}
	if len(n) > MaxNameBytes {
		return fmt.Errorf("longer than %d bytes", MaxNameBytes)
	}
	for i := 0; i < len(n); i++ {
		b := n[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-') {
			return fmt.Errorf("%q may contain only A-Z a-z 0-9 . _ -", n)
		}
	}
	return nil
}

// File is the policy of an access file, re-read on Reload. It is safe for
// concurrent use: a request sees one whole policy, the old or the new.
type File struct {
	path string
	cur  atomic.Pointer[Policy]
}

// Load reads the access file at path.
func Load(path string) (*File, error) {
	f := &File{path: path}
	if err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Policy is the policy in force.
func (f *File) Policy() *Policy { return f.cur.Load() }

// Reload reads the file again; when it does not parse, the policy in force
// stays and the error says why. Load and Reload read the file as
// configfile.Read does: a regular file (links followed) of at most
// configfile.MaxBytes, opened without blocking.
func (f *File) Reload() error {
	data, err := configfile.Read(f.path)
	if err != nil {
		return err
	}
	p, err := Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	f.cur.Store(p)
	return nil
}

// Static wraps a policy built in code (tests, embedding) as a File that
// never reloads.
func Static(p *Policy) *File {
	f := &File{}
	f.cur.Store(p)
	return f
}
