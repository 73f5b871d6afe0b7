package config

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestLoadDefaults(t *testing.T) {
	c, err := Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.APIAddr != "127.0.0.1:7070" || c.ProxyAddr != "127.0.0.1:8080" || c.Store != "file:fencegate.db" {
		t.Fatalf("defaults: %+v", c)
	}
	if c.DefaultTTL != 30*time.Second || c.MaxCheckpointBytes != 1<<20 || c.APIBodyMemory != 8<<20 || c.ResourceHeader != nil || c.Upstream != "" {
		t.Fatalf("defaults: %+v", c)
	}
	// Unset: the Fencing-Resource header is a fallback only without rules.
	if !c.ResourceHeaderOn(0) || c.ResourceHeaderOn(1) {
		t.Fatalf("unset FENCEGATE_RESOURCE_HEADER: on(0 rules)=%v on(1 rule)=%v", c.ResourceHeaderOn(0), c.ResourceHeaderOn(1))
	}
}

func TestLoadOverrides(t *testing.T) {
	c, err := Load([]string{
		"FENCEGATE_API_ADDR=127.0.0.1:0", "FENCEGATE_STORE=memory:", "FENCEGATE_DEFAULT_TTL=2m",
		"FENCEGATE_RESOURCE_HEADER=false", "FENCEGATE_UPSTREAM=http://127.0.0.1:9000", "UNRELATED=x",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.APIAddr != "127.0.0.1:0" || c.Store != "memory:" || c.DefaultTTL != 2*time.Minute || c.ResourceHeaderOn(0) || c.Upstream != "http://127.0.0.1:9000" {
		t.Fatalf("overrides not applied: %+v", c)
	}
	on, err := Load([]string{"FENCEGATE_RESOURCE_HEADER=true"})
	if err != nil || !on.ResourceHeaderOn(3) {
		t.Fatalf("FENCEGATE_RESOURCE_HEADER=true with rules: %v %v", on.ResourceHeaderOn(3), err)
	}
}

func TestLoadErrorsNameTheVariable(t *testing.T) {
	cases := []struct {
		env  string
		want string
	}{
		{"FENCEGATE_DEFAULT_TTL=soon", "FENCEGATE_DEFAULT_TTL"},
		{"FENCEGATE_DEFAULT_TTL=0s", "FENCEGATE_DEFAULT_TTL"},
		{"FENCEGATE_DEFAULT_TTL=25h", "FENCEGATE_DEFAULT_TTL"},
		{"FENCEGATE_MAX_CHECKPOINT_BYTES=-1", "FENCEGATE_MAX_CHECKPOINT_BYTES"},
		{"FENCEGATE_MAX_CHECKPOINT_BYTES=lots", "FENCEGATE_MAX_CHECKPOINT_BYTES"},
		{"FENCEGATE_API_BODY_MEMORY=65535", "FENCEGATE_API_BODY_MEMORY"},
		{"FENCEGATE_API_BODY_MEMORY=-1", "FENCEGATE_API_BODY_MEMORY"},
		{"FENCEGATE_RESOURCE_HEADER=maybe", "FENCEGATE_RESOURCE_HEADER"},
		{"FENCEGATE_STORE=mysql://x", "FENCEGATE_STORE"},
		{"FENCEGATE_STORE=postgres://h:99999999999/%zz", "FENCEGATE_STORE"},
		{"FENCEGATE_PG_STATEMENT_TIMEOUT=0s", "FENCEGATE_PG_STATEMENT_TIMEOUT"},
		{"FENCEGATE_STORE=file:", "FENCEGATE_STORE"},
		{"FENCEGATE_UPSTREAM=ftp://x", "FENCEGATE_UPSTREAM"},
		{"FENCEGATE_UPSTREAM=http://127.0.0.1:99999", "FENCEGATE_UPSTREAM"},
		{"FENCEGATE_UPSTREAM=https://upstream.internal:65536/api", "FENCEGATE_UPSTREAM"},
		{"FENCEGATE_UPSTREAM=http://[::1]:0", "FENCEGATE_UPSTREAM"},
		{"FENCEGATE_API_ADDR=7070", "FENCEGATE_API_ADDR"},
		{"FENCEGATE_LOG_FORMAT=xml", "FENCEGATE_LOG_FORMAT"},
		{"FENCEGATE_LOG_LEVEL=loud", "FENCEGATE_LOG_LEVEL"},
		{"FENCEGATE_BARRIER_TIMEOUT=0s", "FENCEGATE_BARRIER_TIMEOUT"},
		{"FENCEGATE_KEY_PREFIX=a{b}", "FENCEGATE_KEY_PREFIX"},
		{"FENCEGATE_VALKEY_WAIT_REPLICAS=-1", "FENCEGATE_VALKEY_WAIT_REPLICAS"},
		{"FENCEGATE_VALKEY_WAIT_TIMEOUT=0s", "FENCEGATE_VALKEY_WAIT_TIMEOUT"},
		{"FENCEGATE_VALKEY_COMMAND_TIMEOUT=-1s", "FENCEGATE_VALKEY_COMMAND_TIMEOUT"},
		{"FENCEGATE_VALKEY_DIAL_TIMEOUT=0s", "FENCEGATE_VALKEY_DIAL_TIMEOUT"},
		{"FENCEGATE_MAX_CHECKPOINT_BYTES=16777217", "FENCEGATE_MAX_CHECKPOINT_BYTES"},
		{"FENCEGATE_UPSTREAM_TIMEOUT=0s", "FENCEGATE_UPSTREAM_TIMEOUT"},
		{"FENCEGATE_BODY_TIMEOUT=0s", "FENCEGATE_BODY_TIMEOUT"},
		{"FENCEGATE_READ_HEADER_TIMEOUT=0s", "FENCEGATE_READ_HEADER_TIMEOUT"},
		{"FENCEGATE_IDLE_TIMEOUT=-1s", "FENCEGATE_IDLE_TIMEOUT"},
		{"FENCEGATE_MAX_CONNS=0", "FENCEGATE_MAX_CONNS"},
		{"FENCEGATE_TIMEOUT_GRACE=-1s", "FENCEGATE_TIMEOUT_GRACE"},
		{"FENCEGATE_DRAIN_DELAY=-1s", "FENCEGATE_DRAIN_DELAY"},
		{"FENCEGATE_SHUTDOWN_GRACE=0s", "FENCEGATE_SHUTDOWN_GRACE"},
		{"FENCEGATE_BARRIER=global", "FENCEGATE_BARRIER"},
		{"FENCEGATE_BARRIER=shared", "FENCEGATE_BARRIER"}, // on the default file store
		{"FENCEGATE_GATE_ID=a|b", "FENCEGATE_GATE_ID"},
	}
	for _, tc := range cases {
		_, err := Load([]string{tc.env})
		if err == nil {
			t.Errorf("%s: accepted", tc.env)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "accepts") {
			t.Errorf("%s: error %q does not name %s and what it accepts", tc.env, err, tc.want)
		}
	}
	if _, err := Load([]string{"FENCEGATE_RULES=PUT /a fence a", "FENCEGATE_RULES_FILE=rules.txt"}); err == nil || !strings.Contains(err.Error(), "FENCEGATE_RULES_FILE") {
		t.Errorf("FENCEGATE_RULES and FENCEGATE_RULES_FILE both set: error %v", err)
	}
}

func TestStoreURLPasswordIsRedacted(t *testing.T) {
	_, err := Load([]string{"FENCEGATE_STORE=redis://user:hunter2@"})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v leaks the password or accepts a URL without a host", err)
	}
	s, err := ParseStore("valkeys://user:hunter2@host:6379/2")
	if err != nil || s.Kind != StoreValkey || strings.Contains(s.Redacted(), "hunter2") {
		t.Fatalf("ParseStore: %+v %v redacted %q", s, err, s.Redacted())
	}
	s, err = ParseStore("postgres://user:hunter2@host/db?sslmode=require")
	if err != nil || s.Kind != StorePostgres || strings.Contains(s.Redacted(), "hunter2") {
		t.Fatalf("ParseStore: %+v %v redacted %q", s, err, s.Redacted())
	}
	if _, err := Load([]string{"FENCEGATE_STORE=postgres://u:hunter2@h/db", "FENCEGATE_PG_SCHEMA=Bad-Name"}); err == nil ||
		strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "FENCEGATE_PG_SCHEMA") {
		t.Fatalf("a bad schema name: %v", err)
	}
}

// TestStoreURLQueryPasswordIsRedacted: PostgreSQL also takes its password
// from ?password= (and an encrypted client key's from ?sslpassword=), and
// its host from ?host= or PGHOST (an empty URL host): the store open line
// (Redacted), ParseStore's errors and `fencegate check` (RedactURL) hide
// them all; a connection string of another form is refused without being
// repeated.
func TestStoreURLQueryPasswordIsRedacted(t *testing.T) {
	const pw = "hunter2"
	for _, raw := range []string{
		"postgres://fencegate@db:5432/app?password=" + pw,
		"postgres://fencegate@db:5432/app?sslmode=verify-full&sslpassword=" + pw,
		"postgres://fencegate:" + pw + "@/app?host=/run/postgresql",
		"postgres:///app?host=/run/postgresql&password=" + pw,
		"host=db user=fencegate password=" + pw + " dbname=app",
	} {
		spec, err := ParseStore(raw)
		if err != nil && strings.Contains(err.Error(), pw) {
			t.Errorf("ParseStore(%q) error shows the password: %v", raw, err)
		}
		if err == nil && strings.Contains(spec.Redacted(), pw) {
			t.Errorf("StoreSpec.Redacted() of %q shows the password: %s", raw, spec.Redacted())
		}
		if got := RedactURL(raw); err == nil && strings.Contains(got, pw) {
			t.Errorf("RedactURL(%q) shows the password: %s", raw, got)
		}
	}
}

func TestParseStore(t *testing.T) {
	for raw, want := range map[string]StoreSpec{
		"memory:":           {Kind: StoreMemory},
		"file:fencegate.db": {Kind: StoreFile, Path: "fencegate.db"},
		"file:///var/f.db":  {Kind: StoreFile, Path: "/var/f.db"},
		"valkey://h:1":      {Kind: StoreValkey, URL: "valkey://h:1"},
		"postgres://u@h/db": {Kind: StorePostgres, URL: "postgres://u@h/db"},
		"postgresql:///db":  {Kind: StorePostgres, URL: "postgresql:///db"},
		"redis://h:1/2":     {Kind: StoreValkey, URL: "redis://h:1/2"},
		"rediss://h:1":      {Kind: StoreValkey, URL: "rediss://h:1"},
	} {
		got, err := ParseStore(raw)
		if err != nil || got != want {
			t.Errorf("ParseStore(%q) = %+v, %v; want %+v", raw, got, err, want)
		}
	}
}

func TestParseStoreRefuses(t *testing.T) {
	for _, raw := range []string{"", "file:", "redis:/h", "redis://", "http://h:1", "memory"} {
		if got, err := ParseStore(raw); err == nil {
			t.Errorf("ParseStore(%q) = %+v, want an error", raw, got)
		}
	}
}

func TestHelpCoversEveryField(t *testing.T) {
	for _, v := range Help() {
		if v.Name == Prefix || v.Accepts == "" {
			t.Errorf("variable %+v lacks an env name or help text", v)
		}
	}
}

// TestReferenceTableMatchesKnown keeps the configuration reference table
// in docs/operations.md and the variables config knows in step, both ways:
// every variable has exactly one row with its default, and every row names
// a variable config knows.
func TestReferenceTableMatchesKnown(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{} // name -> default column of each row
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`"+Prefix) {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		rows[name] = append(rows[name], strings.Trim(strings.TrimSpace(cells[2]), "`"))
	}
	want := map[string]bool{}
	for _, v := range append(Help(), ClientVars...) {
		want[v.Name] = true
		got, ok := rows[v.Name]
		switch {
		case !ok:
			t.Errorf("docs/operations.md has no configuration row for %s", v.Name)
		case len(got) != 1:
			t.Errorf("docs/operations.md has %d rows for %s, want one", len(got), v.Name)
		case got[0] != v.Default:
			t.Errorf("docs/operations.md gives %s the default %q, config.go %q", v.Name, got[0], v.Default)
		}
	}
	for name := range rows {
		if !want[name] {
			t.Errorf("docs/operations.md has a row for %s, which config does not know", name)
		}
	}
}

func TestSharedBarrierNeedsASharedStore(t *testing.T) {
	for _, store := range []string{"memory:", "file:x.db"} {
		if _, err := Load([]string{"FENCEGATE_BARRIER=shared", "FENCEGATE_STORE=" + store}); err == nil || !strings.Contains(err.Error(), "FENCEGATE_BARRIER") {
			t.Errorf("shared barrier on %s: error %v, want a refusal naming FENCEGATE_BARRIER", store, err)
		}
	}
	if _, err := Load([]string{"FENCEGATE_BARRIER=shared", "FENCEGATE_STORE=valkey://h:6379", "FENCEGATE_VALKEY_WAIT_REPLICAS=1"}); err == nil {
		t.Error("shared barrier with FENCEGATE_VALKEY_WAIT_REPLICAS accepted")
	}
	c, err := Load([]string{"FENCEGATE_BARRIER=shared", "FENCEGATE_STORE=valkey://h:6379", "FENCEGATE_GATE_ID=gate-1.eu_west"})
	if err != nil || c.Barrier != BarrierShared || c.GateID != "gate-1.eu_west" {
		t.Errorf("shared barrier on valkey: %+v, %v", c, err)
	}
	if c, err := Load([]string{"FENCEGATE_BARRIER=shared", "FENCEGATE_STORE=postgres://h/db"}); err != nil || c.Barrier != BarrierShared {
		t.Errorf("shared barrier on postgres: %+v, %v", c, err)
	}
}

// FENCEGATE_MAX_CONNS_PER_CLIENT: unset, a quarter of FENCEGATE_MAX_CONNS
// (at least one); set, from 0 (off) to FENCEGATE_MAX_CONNS; negative or
// above FENCEGATE_MAX_CONNS, an error naming it.
func TestMaxConnsPerClient(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want int
	}{
		{nil, 1024},
		{[]string{"FENCEGATE_MAX_CONNS=100"}, 25},
		{[]string{"FENCEGATE_MAX_CONNS=3"}, 1},
		{[]string{"FENCEGATE_MAX_CONNS_PER_CLIENT=0"}, 0},
		{[]string{"FENCEGATE_MAX_CONNS_PER_CLIENT=4096"}, 4096},
		{[]string{"FENCEGATE_MAX_CONNS=10", "FENCEGATE_MAX_CONNS_PER_CLIENT=4"}, 4},
	} {
		cfg, err := Load(c.env)
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		if got := cfg.ConnsPerClient(); got != c.want {
			t.Errorf("%v: %d connections per client, want %d", c.env, got, c.want)
		}
	}
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"FENCEGATE_MAX_CONNS_PER_CLIENT=-1"}, "-1 is negative"},
		{[]string{"FENCEGATE_MAX_CONNS_PER_CLIENT=4097"}, "4097 is above FENCEGATE_MAX_CONNS (4096)"},
		{[]string{"FENCEGATE_MAX_CONNS=10", "FENCEGATE_MAX_CONNS_PER_CLIENT=11"}, "11 is above FENCEGATE_MAX_CONNS (10)"},
		{[]string{"FENCEGATE_MAX_CONNS_PER_CLIENT=some"}, `"some" is not a whole number`},
	} {
		_, err := Load(c.env)
		if err == nil || !strings.Contains(err.Error(), "FENCEGATE_MAX_CONNS_PER_CLIENT: "+c.want) {
			t.Errorf("%v: error %v, want FENCEGATE_MAX_CONNS_PER_CLIENT: %s", c.env, err, c.want)
		}
	}
}

// TestTLSWatchIsOffOrAtLeastASecond: a watch period of a nanosecond would
// read the TLS files in a loop; 0 (SIGHUP only) and 1s upwards are taken.
func TestTLSWatchIsOffOrAtLeastASecond(t *testing.T) {
	for v, ok := range map[string]bool{"0": true, "1s": true, "2h": true, "1ns": false, "999ms": false, "-1s": false} {
		cfg, err := Load([]string{"FENCEGATE_TLS_WATCH=" + v})
		switch {
		case ok && err != nil:
			t.Errorf("FENCEGATE_TLS_WATCH=%s: %v", v, err)
		case !ok && (err == nil || !strings.Contains(err.Error(), "FENCEGATE_TLS_WATCH: ")):
			t.Errorf("FENCEGATE_TLS_WATCH=%s: Load = %v (%v), want it refused naming the variable", v, cfg.TLSWatch, err)
		}
	}
}

// TestEmptyIsRefusedWhereUnsetIsWeaker: FENCEGATE_API_TOKEN,
// FENCEGATE_ACCESS_FILE, the client CA bundles, the rules and
// FENCEGATE_STORE set to an empty value (a Kubernetes Secret with an empty
// key) stop start-up, naming the variable, instead of meaning no
// authentication, no mutual TLS, no rules or the default file store; other
// variables set empty keep meaning their default.
func TestEmptyIsRefusedWhereUnsetIsWeaker(t *testing.T) {
	for _, name := range []string{"FENCEGATE_API_TOKEN", "FENCEGATE_ACCESS_FILE", "FENCEGATE_STORE",
		"FENCEGATE_API_TLS_CLIENT_CA", "FENCEGATE_PROXY_TLS_CLIENT_CA", "FENCEGATE_RULES", "FENCEGATE_RULES_FILE"} {
		for _, v := range []string{"", " "} {
			_, err := Load([]string{name + "=" + v})
			if err == nil || !strings.Contains(err.Error(), name+" is set but empty") {
				t.Errorf("%s=%q: Load = %v, want it refused as set but empty", name, v, err)
			}
		}
	}
	c, err := Load([]string{"FENCEGATE_API_ADDR=", "FENCEGATE_BARRIER=", "FENCEGATE_UPSTREAM="})
	if err != nil {
		t.Fatalf("other variables set empty: %v", err)
	}
	if c.APIAddr != "127.0.0.1:7070" || c.Barrier != "local" || c.Upstream != "" {
		t.Fatalf("other variables set empty did not take their defaults: %+v", c)
	}
}

// TestAPIOpenBeyondLoopback: the lease API counts as open to the network
// when it listens beyond loopback and authenticates no one.
func TestAPIOpenBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want bool
	}{
		{Config{APIAddr: "127.0.0.1:7070"}, false},
		{Config{APIAddr: "127.0.0.5:7070"}, false},
		{Config{APIAddr: "[::1]:7070"}, false},
		{Config{APIAddr: "localhost:7070"}, false},
		{Config{APIAddr: "0.0.0.0:7070"}, true},
		{Config{APIAddr: ":7070"}, true},
		{Config{APIAddr: "[::]:7070"}, true},
		{Config{APIAddr: "10.1.2.3:7070"}, true},
		{Config{APIAddr: "api.internal:7070"}, true},
		{Config{APIAddr: "0.0.0.0:7070", APIToken: "t"}, false},
		{Config{APIAddr: "0.0.0.0:7070", AccessFile: "/etc/fencegate/access.yaml"}, false},
		{Config{APIAddr: "0.0.0.0:7070", APITLSClientCA: "/etc/fencegate/ca.pem"}, false},
	} {
		if got := tc.c.APIOpenBeyondLoopback(); got != tc.want {
			t.Errorf("%+v: APIOpenBeyondLoopback = %v, want %v", tc.c, got, tc.want)
		}
	}
}

// FENCEGATE_LOOPS: unset or 0 leaves the number of event loops to the
// gate; 1 to MaxLoops sets it; anything else stops start-up, naming it.
func TestLoops(t *testing.T) {
	for env, want := range map[string]int{"": 0, "FENCEGATE_LOOPS=0": 0, "FENCEGATE_LOOPS=3": 3, "FENCEGATE_LOOPS=256": 256} {
		c, err := Load([]string{env})
		if err != nil || c.Loops != want {
			t.Errorf("%q: Loops %d, %v; want %d", env, c.Loops, err, want)
		}
	}
	for _, env := range []string{"FENCEGATE_LOOPS=-1", "FENCEGATE_LOOPS=257", "FENCEGATE_LOOPS=two"} {
		if _, err := Load([]string{env}); err == nil || !strings.Contains(err.Error(), "FENCEGATE_LOOPS") {
			t.Errorf("%q: error %v, want a refusal naming FENCEGATE_LOOPS", env, err)
		}
	}
}

// TestUpstreamSocketErrorsHideCredentials: a unix: upstream refused for
// its query does not repeat a credential in it.
func TestUpstreamSocketErrorsHideCredentials(t *testing.T) {
	for _, raw := range []string{"unix:/run/app.sock?token=S3cret", "unix:/run/a%zz.sock?token=S3cret"} {
		if err := validateUpstream(raw); err == nil || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("validateUpstream(%q) = %v: the token shows", raw, err)
		}
	}
}
