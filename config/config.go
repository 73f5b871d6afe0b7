// Package config is fencegate's one configuration struct, parsed from
// FENCEGATE_* environment variables with caarlos0/env and validated. It is
// the only package besides cmd/ that looks at the environment, and it takes
// the environment as a map so tests need no os.Setenv.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore"
	"github.com/fencegate/fencegate/fencing/valkeystore"
	"github.com/fencegate/fencegate/internal/apitoken"
)

// Prefix starts every variable fencegate reads.
const Prefix = "FENCEGATE_"

// MaxLoops bounds FENCEGATE_LOOPS.
const MaxLoops = 256

// MinAPIBodyMemory is the least FENCEGATE_API_BODY_MEMORY: one lease
// call's largest body (leaseapi.LeaseBodyLimit).
const MinAPIBodyMemory = 64 << 10

// Config is fencegate's whole configuration. Each field's env tag is the
// variable name after Prefix; the help tag says what it accepts and is used
// in error messages and the README's table; secret:"true" keeps a value
// out of 'fencegate check'. Every env-tagged field is a known variable:
// Load refuses any other FENCEGATE_* variable (see ClientVars).
type Config struct {
	APIAddr   string `env:"API_ADDR" envDefault:"127.0.0.1:7070" help:"host:port of the lease API, health and metrics listener"`
	APIToken  string `env:"API_TOKEN" secret:"true" help:"when set, every /v1 call needs Authorization: Bearer <token>; visible ASCII without spaces"`
	ProxyAddr string `env:"PROXY_ADDR" envDefault:"127.0.0.1:8080" help:"host:port of the write gate listener"`
	Upstream  string `env:"UPSTREAM" help:"http(s) URL the write gate forwards to, or unix:/absolute/path.sock for a service on a Unix socket; the gate is off when unset"`
	Store     string `env:"STORE" envDefault:"file:fencegate.db" help:"file:PATH, memory:, valkey://[user:pass@]host:port[/db][?addr=host:port...], valkeys://..., or postgres://[user[:pass]@]host[:port]/db[?sslmode=...&pool_max_conns=...] (postgresql:// too)"`
	KeyPrefix string `env:"KEY_PREFIX" envDefault:"fencegate" help:"key prefix in Valkey, 1 to 100 bytes of A-Z a-z 0-9 . _ : -"`

	APITLSCert     string `env:"API_TLS_CERT" help:"PEM certificate chain file: the lease API serves HTTPS (TLS 1.2+, ALPN h2 and http/1.1); set with FENCEGATE_API_TLS_KEY; re-read on SIGHUP and on change (FENCEGATE_TLS_WATCH)"`
	APITLSKey      string `env:"API_TLS_KEY" help:"PEM private key file of FENCEGATE_API_TLS_CERT"`
	APITLSClientCA string `env:"API_TLS_CLIENT_CA" help:"PEM bundle of CA certificates: the lease API requires a client certificate they verify (mutual TLS); needs FENCEGATE_API_TLS_CERT"`
	AccessFile     string `env:"ACCESS_FILE" help:"YAML file of lease API clients (bearer token SHA-256 or client certificate URI/DNS SAN) with their permissions by resource prefix; re-read on SIGHUP; instead of FENCEGATE_API_TOKEN"`

	ProxyTLSCert        string        `env:"PROXY_TLS_CERT" help:"PEM certificate chain file: the write gate serves HTTPS (TLS 1.2+, ALPN h2 and http/1.1); set with FENCEGATE_PROXY_TLS_KEY; re-read on SIGHUP and on change (FENCEGATE_TLS_WATCH)"`
	ProxyTLSKey         string        `env:"PROXY_TLS_KEY" help:"PEM private key file of FENCEGATE_PROXY_TLS_CERT"`
	ProxyTLSClientCA    string        `env:"PROXY_TLS_CLIENT_CA" help:"PEM bundle of CA certificates: the write gate requires a client certificate they verify (mutual TLS); needs FENCEGATE_PROXY_TLS_CERT"`
	ProxyH2C            bool          `env:"PROXY_H2C" envDefault:"false" help:"true or false: the cleartext write gate also serves HTTP/2 with prior knowledge (h2c); not with FENCEGATE_PROXY_TLS_CERT, where HTTP/2 comes by ALPN"`
	UpstreamReuseWrites bool          `env:"UPSTREAM_REUSE_WRITES" envDefault:"true" help:"true or false: false sends every write on an upstream connection of its own, closed after the answer, so an upstream that sends bytes after a complete response can never have them read as a later write's answer (such writes go through the general engine)"`
	UpstreamHTTP2       bool          `env:"UPSTREAM_HTTP2" envDefault:"false" help:"true or false: speak HTTP/2 to the upstream (h2c for http:// and unix:, ALPN for https://); needed for a gRPC service"`
	TLSWatch            time.Duration `env:"TLS_WATCH" envDefault:"1m" help:"how often the TLS certificate, key and CA files are checked for changes on disk and re-read when changed, a duration of at least 1s; 0 re-reads them on SIGHUP only"`

	ValkeyDialTimeout    time.Duration `env:"VALKEY_DIAL_TIMEOUT" envDefault:"5s" help:"Valkey connection attempt timeout, a duration > 0"`
	ValkeyCommandTimeout time.Duration `env:"VALKEY_COMMAND_TIMEOUT" envDefault:"2s" help:"Valkey per-operation timeout (a write gives up with 503 after it), a duration > 0"`
	ValkeyCAFile         string        `env:"VALKEY_CA_FILE" help:"PEM file of CA certificates to verify a valkeys:// server (default: the system roots)"`
	ValkeyWaitReplicas   int           `env:"VALKEY_WAIT_REPLICAS" envDefault:"0" help:"replicas (>= 0) that must confirm (Valkey WAIT) the high-water mark a write relies on before it is forwarded; 0 never waits"`
	ValkeyWaitTimeout    time.Duration `env:"VALKEY_WAIT_TIMEOUT" envDefault:"1s" help:"how long a write waits for those replicas before it fails closed with 503, a duration > 0"`

	PGSchema           string        `env:"PG_SCHEMA" envDefault:"fencegate" help:"PostgreSQL schema of the store's tables, 1 to 63 bytes of a-z 0-9 _ (not starting with a digit)"`
	PGStatementTimeout time.Duration `env:"PG_STATEMENT_TIMEOUT" envDefault:"2s" help:"PostgreSQL per-operation timeout (the server's statement_timeout unless the URL sets one; a write gives up with 503 after it), a duration >= 1ms"`

	DefaultTTL         time.Duration `env:"DEFAULT_TTL" envDefault:"30s" help:"lease TTL when ttl_seconds is absent, whole seconds in [1s, 24h]"`
	MaxCheckpointBytes int           `env:"MAX_CHECKPOINT_BYTES" envDefault:"1048576" help:"largest checkpoint state in bytes, 1 to 16777216"`
	APIBodyMemory      int           `env:"API_BODY_MEMORY" envDefault:"8388608" help:"most bytes of request bodies the lease API holds at once, at least 65536 (one client address may hold half; neither is ever below one checkpoint body, FENCEGATE_MAX_CHECKPOINT_BYTES + 65536); a call whose body would not fit is answered 503 overloaded with Retry-After before its body is read"`
	Retention          time.Duration `env:"RETENTION" envDefault:"720h" help:"how long a resource with no live lease, untouched (acquire, renew, release, checkpoint, admitted write), keeps its record before the store removes it with its checkpoint (its old tokens stay refused), a duration >= 1s; 0 keeps records forever"`

	Rules           string        `env:"RULES" help:"write gate route rules, one per line"`
	RulesFile       string        `env:"RULES_FILE" help:"path of a file with route rules (instead of FENCEGATE_RULES)"`
	ResourceHeader  *bool         `env:"RESOURCE_HEADER" help:"true or false: take the resource from the Fencing-Resource header when no rule matches; unset: true without rules, false with rules"`
	BarrierTimeout  time.Duration `env:"BARRIER_TIMEOUT" envDefault:"10s" help:"longest wait behind a lower-token write in flight, a duration > 0"`
	TimeoutGrace    time.Duration `env:"TIMEOUT_GRACE" envDefault:"30s" help:"how long the barrier stays closed after a write with an unknown outcome (upstream timeout, body cut off, shutdown), also across a restart, a duration >= 0; 0 turns it off"`
	UpstreamTimeout time.Duration `env:"UPSTREAM_TIMEOUT" envDefault:"30s" help:"longest exchange with the upstream, from sending the request to the end of its response, a duration > 0"`
	UpstreamConns   int           `env:"UPSTREAM_CONNS" envDefault:"1024" help:"most connections to the upstream (> 0) of each engine: the event loops of a listener together, and the general engine; a request that finds them all busy waits for one"`
	BodyBuffer      int           `env:"BODY_BUFFER" envDefault:"16384" help:"largest request body in bytes (by its Content-Length) the gate reads in full before admitting a write; larger and chunked bodies stream through; 0 streams every body. A connection whose client stalls such a body holds up to this many bytes (and about 10 KiB more): size it with FENCEGATE_MAX_CONNS"`
	AuditLog        string        `env:"AUDIT_LOG" envDefault:"on" help:"one info line per write through the gate: on, off, or a fraction between 0 and 1 (such as 0.1) of successful writes to log; refusals and faults are always logged (with off, at most 20 a second)"`
	AccessLog       bool          `env:"ACCESS_LOG" envDefault:"false" help:"true or false: one info line per lease API call and per read through the gate (client address, method, path, status, duration, request id); health checks and /metrics are not logged"`
	Barrier         string        `env:"BARRIER" envDefault:"local" help:"local (order writes through this gate) or shared (order writes across every gate on the store; valkey:// or postgres:// only)"`
	GateID          string        `env:"GATE_ID" help:"this gate's name in shared-barrier entries, 1 to 100 bytes of A-Z a-z 0-9 . _ -; default: host name and process id"`

	ReadHeaderTimeout time.Duration `env:"READ_HEADER_TIMEOUT" envDefault:"10s" help:"longest time a client may take to send a request's headers, on both listeners, a duration > 0"`
	BodyTimeout       time.Duration `env:"BODY_TIMEOUT" envDefault:"10s" help:"longest time a client may take to send a request body: on the gate, a buffered body before admission and a streamed one from when the request is forwarded; on the lease API once its headers are read; a duration > 0"`
	IdleTimeout       time.Duration `env:"IDLE_TIMEOUT" envDefault:"2m" help:"how long an idle keep-alive connection stays open, a duration > 0"`
	MaxConns          int           `env:"MAX_CONNS" envDefault:"4096" help:"most concurrent client connections per listener (> 0); beyond it a connection is answered 503 too-many-connections and closed, while a small reserve keeps /livez and /readyz answering; a quarter of it bounds the gate's HTTP/2 requests in flight over all connections, one beyond answered 503 too-many-connections at once"`
	MaxConnsPerClient *int          `env:"MAX_CONNS_PER_CLIENT" help:"most concurrent connections one client (a TCP peer's IPv4 address, or the /64 prefix of its IPv6 one) may hold per listener, from 0 to FENCEGATE_MAX_CONNS; beyond it a connection is answered 503 too-many-connections and closed, counting against nothing; 0 turns the per-client cap off; unset: a quarter of FENCEGATE_MAX_CONNS (1024 with its default); half of it bounds one client's HTTP/2 requests in flight on the gate the same way"`
	IOURing           bool          `env:"IO_URING" envDefault:"true" help:"true or false: on Linux the gate's event loops batch their socket reads and writes through io_uring where the kernel allows it (5.12 or later); false makes one system call per read and write"`
	MarkReaders       bool          `env:"MARK_READERS" envDefault:"true" help:"true or false: on Linux with a single-node Valkey store, each event loop reads high-water marks over a store connection of its own, inside the loop; false admits every write through the store's client (valkey-go's pipelining)"`
	Loops             int           `env:"LOOPS" envDefault:"0" help:"how many event loops serve the gate listener on Linux, 0 to 256; 0: one per CPU Go uses (GOMAXPROCS)"`
	SpareProcessor    bool          `env:"SPARE_PROCESSOR" envDefault:"true" help:"true or false: on Linux, when the gate's event loops hold as many processors as Go runs (GOMAXPROCS), Go gets one more for the gate's other work (admissions that write to the store, the lease API, the garbage collector); ignored when the GOMAXPROCS environment variable is set"`
	TLSLoops          bool          `env:"TLS_LOOPS" envDefault:"true" help:"true or false: on Linux the gate's event loops serve the HTTP/1.1 connections of a TLS gate listener (FENCEGATE_PROXY_TLS_CERT), through a relay that terminates TLS in Go; HTTP/2 by ALPN stays on the general engine; false serves every TLS connection with the general engine"`

	ReadyWithoutStore bool          `env:"READY_WITHOUT_STORE" envDefault:"false" help:"true or false: keep /readyz at 200 while the store does not answer, so reads through the gate keep flowing (writes and lease calls still fail closed with 503); false takes the process out of its load balancer until the store answers"`
	DrainDelay        time.Duration `env:"DRAIN_DELAY" envDefault:"0s" help:"after SIGTERM, how long /readyz answers 503 before the listeners close, a duration >= 0"`
	ShutdownGrace     time.Duration `env:"SHUTDOWN_GRACE" envDefault:"15s" help:"after the drain delay, how long in-flight requests may take to finish, a duration > 0"`
	LogFormat         string        `env:"LOG_FORMAT" envDefault:"json" help:"json or text"`
	LogLevel          string        `env:"LOG_LEVEL" envDefault:"info" help:"debug, info, warn or error"`
}

// Load parses and validates the configuration from environ (KEY=VALUE
// pairs, as os.Environ returns). Errors name the variable and what it
// accepts; a FENCEGATE_* variable that is neither a Config field nor one
// of ClientVars is an error, with the nearest known name suggested. An
// empty value means unset (the default), except for FENCEGATE_API_TOKEN,
// FENCEGATE_ACCESS_FILE and FENCEGATE_STORE, where it is an error (see
// notEmpty).
func Load(environ []string) (Config, error) {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	refused := errors.Join(checkKnown(m), checkNotEmpty(m))
	var c Config
	if err := env.ParseWithOptions(&c, env.Options{Environment: m, Prefix: Prefix}); err != nil {
		return Config{}, errors.Join(refused, explain(err, m))
	}
	if err := errors.Join(refused, c.Validate()); err != nil {
		return Config{}, err
	}
	return c, nil
}

// explain rewrites caarlos0/env's field-named errors, which quote Go's
// parser (strconv.ParseBool: parsing "yes": invalid syntax), into
// variable-named ones that say in words what the variable accepts.
func explain(err error, environ map[string]string) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	var errs []error
	for _, e := range agg.Errors {
		var pe env.ParseError
		if !errors.As(e, &pe) {
			errs = append(errs, e)
			continue
		}
		f, ok := fieldByName(pe.Name)
		if !ok {
			errs = append(errs, e)
			continue
		}
		errs = append(errs, invalid(pe.Name, fmt.Errorf("%q is not %s", environ[f.Name], kindWords(f.Type))))
	}
	return errors.Join(errs...)
}

// kindWords says in words what a value of type t looks like.
func kindWords(t reflect.Type) string {
	for t.Kind() == reflect.Pointer { // an optional value (*bool): unset means "not given"
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "a duration such as 500ms, 10s or 2m"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return "a whole number"
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		return "a whole number >= 0"
	}
	return "a valid " + t.String()
}

// invalid builds an error naming the field's variable and its help text.
func invalid(field string, cause error) error {
	f, ok := fieldByName(field)
	if !ok {
		return cause
	}
	return fmt.Errorf("%s: %v (accepts %s)", f.Name, cause, f.Help)
}

// Validate checks invariants the types alone do not.
func (c Config) Validate() error {
	var errs []error
	check := func(field string, err error) {
		if err != nil {
			errs = append(errs, invalid(field, err))
		}
	}
	check("APIAddr", validateAddr(c.APIAddr))
	check("APIToken", ValidateAPIToken(c.APIToken))
	if c.AccessFile != "" && c.APIToken != "" {
		check("AccessFile", errors.New("set FENCEGATE_ACCESS_FILE or FENCEGATE_API_TOKEN, not both (give the token's holders a client entry with its token_sha256)"))
	}
	tlsTrio(check, "API_TLS", "APITLSCert", "APITLSKey", "APITLSClientCA", c.APITLSCert, c.APITLSKey, c.APITLSClientCA)
	tlsTrio(check, "PROXY_TLS", "ProxyTLSCert", "ProxyTLSKey", "ProxyTLSClientCA", c.ProxyTLSCert, c.ProxyTLSKey, c.ProxyTLSClientCA)
	if c.ProxyH2C && c.ProxyTLSCert != "" {
		check("ProxyH2C", errors.New("true does not combine with FENCEGATE_PROXY_TLS_CERT: a TLS gate listener offers HTTP/2 by ALPN"))
	}
	if c.TLSWatch < 0 || c.TLSWatch > 0 && c.TLSWatch < MinTLSWatch {
		// Each check reads every file named; a nanosecond would spin.
		check("TLSWatch", fmt.Errorf("%v is neither 0 (SIGHUP only) nor at least %v", c.TLSWatch, MinTLSWatch))
	}
	if c.Upstream != "" {
		check("ProxyAddr", validateAddr(c.ProxyAddr))
		check("Upstream", validateUpstream(c.Upstream))
	}
	_, err := ParseStore(c.Store)
	check("Store", err)
	check("KeyPrefix", valkeystore.ValidateKeyPrefix(c.KeyPrefix))
	check("PGSchema", pgstore.ValidateSchema(c.PGSchema))
	if c.PGStatementTimeout < time.Millisecond {
		check("PGStatementTimeout", fmt.Errorf("%v is below 1ms", c.PGStatementTimeout))
	}
	if fencing.ValidateTTL(c.DefaultTTL) != nil {
		check("DefaultTTL", fmt.Errorf("%v is out of range", c.DefaultTTL))
	}
	if c.Retention != 0 && c.Retention < time.Second {
		check("Retention", fmt.Errorf("%v is below 1s (0 keeps records forever)", c.Retention))
	}
	if c.MaxCheckpointBytes < 1 || c.MaxCheckpointBytes > fencing.MaxCheckpointBytesCeiling {
		check("MaxCheckpointBytes", fmt.Errorf("%d is out of range", c.MaxCheckpointBytes))
	}
	if c.APIBodyMemory < MinAPIBodyMemory {
		check("APIBodyMemory", fmt.Errorf("%d is below %d", c.APIBodyMemory, MinAPIBodyMemory))
	}
	if c.Rules != "" && c.RulesFile != "" {
		check("RulesFile", errors.New("set FENCEGATE_RULES or FENCEGATE_RULES_FILE, not both"))
	}
	positive := func(field string, d time.Duration) {
		if d <= 0 {
			check(field, fmt.Errorf("%v is not positive", d))
		}
	}
	positive("BarrierTimeout", c.BarrierTimeout)
	positive("UpstreamTimeout", c.UpstreamTimeout)
	positive("ReadHeaderTimeout", c.ReadHeaderTimeout)
	positive("BodyTimeout", c.BodyTimeout)
	positive("IdleTimeout", c.IdleTimeout)
	if c.UpstreamConns < 1 {
		check("UpstreamConns", fmt.Errorf("%d is not positive", c.UpstreamConns))
	}
	if c.BodyBuffer < 0 {
		check("BodyBuffer", fmt.Errorf("%d is negative", c.BodyBuffer))
	}
	if c.Loops < 0 || c.Loops > MaxLoops {
		check("Loops", fmt.Errorf("%d is not between 0 and %d", c.Loops, MaxLoops))
	}
	if c.MaxConns < 1 {
		check("MaxConns", fmt.Errorf("%d is not positive", c.MaxConns))
	}
	if n := c.MaxConnsPerClient; n != nil && *n < 0 {
		check("MaxConnsPerClient", fmt.Errorf("%d is negative", *n))
	} else if n != nil && c.MaxConns >= 1 && *n > c.MaxConns {
		check("MaxConnsPerClient", fmt.Errorf("%d is above FENCEGATE_MAX_CONNS (%d)", *n, c.MaxConns))
	}
	positive("ShutdownGrace", c.ShutdownGrace)
	positive("ValkeyDialTimeout", c.ValkeyDialTimeout)
	positive("ValkeyCommandTimeout", c.ValkeyCommandTimeout)
	positive("ValkeyWaitTimeout", c.ValkeyWaitTimeout)
	if c.ValkeyWaitReplicas < 0 {
		check("ValkeyWaitReplicas", fmt.Errorf("%d is negative", c.ValkeyWaitReplicas))
	}
	if c.DrainDelay < 0 {
		check("DrainDelay", fmt.Errorf("%v is negative", c.DrainDelay))
	}
	if c.TimeoutGrace < 0 {
		check("TimeoutGrace", fmt.Errorf("%v is negative", c.TimeoutGrace))
	}
	if _, _, err := c.Audit(); err != nil {
		check("AuditLog", err)
	}
	check("Barrier", c.validateBarrier())
	if c.GateID != "" { // empty: the default, host name and process id
		check("GateID", ValidateGateID(c.GateID))
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		check("LogFormat", fmt.Errorf("%q is not a log format", c.LogFormat))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		check("LogLevel", fmt.Errorf("%q is not a log level", c.LogLevel))
	}
	return errors.Join(errs...)
}

// Audit is FENCEGATE_AUDIT_LOG parsed: whether the audit log is off, and
// the fraction of successful writes it logs (1: all).
func (c Config) Audit() (off bool, sample float64, err error) {
	switch c.AuditLog {
	case "on":
		return false, 1, nil
	case "off":
		return true, 0, nil
	}
	f, err := strconv.ParseFloat(c.AuditLog, 64)
	if err != nil || !(f > 0 && f <= 1) {
		return false, 0, fmt.Errorf("%q is not on, off or a fraction in (0, 1]", c.AuditLog)
	}
	return false, f, nil
}

// validateAddr accepts what net.Listen("tcp", addr) accepts with a numeric
// port: host:port, [ipv6]:port, or :port, the port 0 to 65535.
func validateAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q does not end in a port number from 0 to 65535", addr)
	}
	return nil
}

// ValidateAPIToken refuses a token a client could never send in an
// Authorization header, such as one with a trailing newline from a secret
// file (see apitoken.Valid, which leaseapi.WithToken asks too). The token
// itself never appears in the error.
func ValidateAPIToken(tok string) error {
	if !apitoken.Valid(tok) {
		return errors.New("the token holds a space, a control character (a trailing newline?) or a non-ASCII character")
	}
	return nil
}

func validateUpstream(raw string) error {
	if strings.HasPrefix(raw, "unix:") {
		_, err := UpstreamSocket(raw)
		return err
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL with a host, nor unix:/absolute/path.sock", RedactURL(raw))
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("%q: port %s is not 1 to 65535", RedactURL(raw), p)
		}
	}
	return nil
}

// UpstreamSocket returns the socket path of a unix:/absolute/path.sock
// upstream. Anything else is an error: a relative path (which would depend
// on the working directory), an empty one, or a query or fragment.
func UpstreamSocket(raw string) (string, error) {
	p, ok := strings.CutPrefix(raw, "unix:")
	if !ok {
		return "", fmt.Errorf("%q is not a unix: upstream", RedactURL(raw))
	}
	p = strings.TrimPrefix(p, "//") // unix:///run/x.sock, as some tools write it
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#") || strings.ContainsFunc(p, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return "", fmt.Errorf("%q is not unix:/absolute/path.sock", RedactURL(raw))
	}
	if path.Clean(p) != p {
		return "", fmt.Errorf("%q: the socket path is not clean (want %s)", RedactURL(raw), path.Clean(p))
	}
	return p, nil
}

// tlsTrio checks one listener's TLS files (FENCEGATE_<name>_CERT, _KEY,
// _CLIENT_CA, the fields certField, keyField, caField): certificate and
// key come together, and a client CA needs them. The files themselves are
// read when the listener starts.
func tlsTrio(check func(string, error), name, certField, keyField, caField, cert, key, clientCA string) {
	certVar, keyVar := Prefix+name+"_CERT", Prefix+name+"_KEY"
	switch {
	case cert != "" && key == "":
		check(certField, fmt.Errorf("is set without %s: set both or neither", keyVar))
	case cert == "" && key != "":
		check(keyField, fmt.Errorf("is set without %s: set both or neither", certVar))
	}
	if clientCA != "" && cert == "" {
		check(caField, fmt.Errorf("mutual TLS needs the listener's own %s and %s", certVar, keyVar))
	}
}

// APIOpenBeyondLoopback reports whether the lease API listens on an
// address that other hosts may reach (anything but a loopback IP or
// localhost) while it authenticates no one: no FENCEGATE_API_TOKEN, no
// FENCEGATE_ACCESS_FILE and no client CA. Any client that reaches it can
// then take and release every lease.
func (c Config) APIOpenBeyondLoopback() bool {
	if c.APIToken != "" || c.AccessFile != "" || c.APITLSClientCA != "" {
		return false
	}
	host, _, err := net.SplitHostPort(c.APIAddr)
	if err != nil {
		return true
	}
	if host == "localhost" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsLoopback()
}

// APITLS reports whether the lease API listener serves TLS.
func (c Config) APITLS() bool { return c.APITLSCert != "" }

// ProxyTLS reports whether the write gate listener serves TLS.
func (c Config) ProxyTLS() bool { return c.ProxyTLSCert != "" }

// StoreKind names a kind of store.
type StoreKind string

// The store kinds.
const (
	StoreFile     StoreKind = "file"
	StoreMemory   StoreKind = "memory"
	StoreValkey   StoreKind = "valkey"
	StorePostgres StoreKind = "postgres"
)

// StoreSpec is a parsed FENCEGATE_STORE.
type StoreSpec struct {
	Kind StoreKind
	Path string // file: the database path
	URL  string // valkey, postgres: the URL as given
}

// ParseStore parses a store URL: file:PATH, memory:, valkey://…,
// valkeys://… (redis://… and rediss://… are accepted as the same),
// postgres://… or postgresql://….
func ParseStore(raw string) (StoreSpec, error) {
	switch {
	case raw == "memory:":
		return StoreSpec{Kind: StoreMemory}, nil
	case strings.HasPrefix(raw, "file:"):
		p := strings.TrimPrefix(raw, "file:")
		p = strings.TrimPrefix(p, "//") // file://PATH is accepted too
		if p == "" {
			return StoreSpec{}, errors.New("file: needs a path, e.g. file:fencegate.db")
		}
		return StoreSpec{Kind: StoreFile, Path: p}, nil
	case strings.HasPrefix(raw, "valkey://"), strings.HasPrefix(raw, "valkeys://"),
		strings.HasPrefix(raw, "redis://"), strings.HasPrefix(raw, "rediss://"):
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return StoreSpec{}, fmt.Errorf("%q is not a valkey URL with a host", RedactURL(raw))
		}
		return StoreSpec{Kind: StoreValkey, URL: raw}, nil
	case strings.HasPrefix(raw, "postgres://"), strings.HasPrefix(raw, "postgresql://"):
		// The host may come from PGHOST or default to the local socket,
		// as with libpq; pgx checks the rest when the store opens.
		if _, err := url.Parse(raw); err != nil {
			return StoreSpec{}, fmt.Errorf("%q is not a postgres URL", RedactURL(raw))
		}
		return StoreSpec{Kind: StorePostgres, URL: raw}, nil
	}
	// Not echoed: a connection string in another form (libpq's
	// "host=… password=…") would show its password.
	return StoreSpec{}, errors.New("the value is not a store URL: memory:, file:PATH, valkey://… or postgres://…")
}

// Redacted is the store URL with any password hidden, for logs.
func (s StoreSpec) Redacted() string {
	switch s.Kind {
	case StoreFile:
		return "file:" + s.Path
	case StoreMemory:
		return "memory:"
	}
	return RedactURL(s.URL)
}

// MinTLSWatch is the shortest FENCEGATE_TLS_WATCH other than 0.
const MinTLSWatch = time.Second

// ResourceHeaderOn resolves FENCEGATE_RESOURCE_HEADER for a gate with
// the given number of route rules: as set, or, unset, on only when there
// are no rules (deriving the resource from the path is the safer mode).
func (c Config) ResourceHeaderOn(rules int) bool {
	if c.ResourceHeader != nil {
		return *c.ResourceHeader
	}
	return rules == 0
}

// ConnsPerClient resolves FENCEGATE_MAX_CONNS_PER_CLIENT: as set (0: no
// per-client cap), or, unset, a quarter of FENCEGATE_MAX_CONNS (at least
// one).
func (c Config) ConnsPerClient() int {
	if c.MaxConnsPerClient != nil {
		return *c.MaxConnsPerClient
	}
	return max(c.MaxConns/4, 1)
}

// Help lists every variable with its default and what it accepts, in
// declaration order: the README's configuration table is made from it.
func Help() []Var {
	fs := fields()
	vars := make([]Var, 0, len(fs))
	for _, f := range fs {
		vars = append(vars, Var{Name: f.Name, Default: f.Default, Accepts: f.Help})
	}
	return vars
}

// Var describes one configuration variable.
type Var struct {
	Name, Default, Accepts string
}

// Barrier modes (FENCEGATE_BARRIER).
const (
	BarrierLocal  = "local"
	BarrierShared = "shared"
)

// validateBarrier checks FENCEGATE_BARRIER against the store: the shared
// barrier needs a store shared by several gates that implements it.
func (c Config) validateBarrier() error {
	switch c.Barrier {
	case BarrierLocal:
		return nil
	case BarrierShared:
	default:
		return fmt.Errorf("%q is neither local nor shared", c.Barrier)
	}
	spec, err := ParseStore(c.Store)
	if err != nil {
		return nil // reported for FENCEGATE_STORE
	}
	switch spec.Kind {
	case StoreValkey:
		if c.ValkeyWaitReplicas > 0 {
			return errors.New("shared does not combine with FENCEGATE_VALKEY_WAIT_REPLICAS > 0 yet")
		}
		return nil
	case StorePostgres:
		return nil
	}
	return fmt.Errorf("shared needs a store shared by several gates (valkey:// or postgres://); the %s store serves one gate", spec.Kind)
}

// ValidateGateID checks a gate id: 1 to 100 bytes of A-Z a-z 0-9 . _ -.
func ValidateGateID(id string) error {
	if id == "" {
		return errors.New("must not be empty")
	}
	if len(id) > 100 {
		return errors.New("must be at most 100 bytes")
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%q may contain only A-Z a-z 0-9 . _ -", id)
		}
	}
	return nil
}
