package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/agnivade/levenshtein"

	"github.com/fencegate/fencegate/internal/redact"
)

// ClientVars are FENCEGATE_* variables read by the client commands
// (fencegate lease, fencegate run), not by the server. Load accepts them so
// that one environment can serve both, and ignores them.
var ClientVars = []Var{
	{Name: Prefix + "API_URL", Default: DefaultAPIURL, Accepts: "base URL of the lease API for the client commands; the server ignores it"},
	{Name: Prefix + "API_CA_FILE", Accepts: "PEM bundle of CA certificates the client commands trust for an https:// lease API (default: the system roots); the server ignores it"},
	{Name: Prefix + "API_CLIENT_CERT", Accepts: "PEM client certificate the client commands present to a mutual-TLS lease API, with FENCEGATE_API_CLIENT_KEY; the server ignores it"},
	{Name: Prefix + "API_CLIENT_KEY", Accepts: "PEM private key of FENCEGATE_API_CLIENT_CERT; the server ignores it"},
}

// DefaultAPIURL is where the client commands find the lease API when
// FENCEGATE_API_URL is unset: the server's default API address.
const DefaultAPIURL = "http://127.0.0.1:7070"

// testSwitches are the FENCEGATE_* variables that scripts/test.sh and the
// tests read (FENCEGATE_REQUIRE_VALKEY, FENCEGATE_REQUIRE_PROMTOOL, ...,
// FENCEGATE_QUICK, the benchmark, soak and crash-round switches). Load ignores them, so
// a shell set up for the tests, or a test that starts the binary with its
// own environment, can still run fencegate.
func testSwitch(name string) bool {
	switch strings.TrimPrefix(name, Prefix) {
	case "QUICK", "VALKEY_BENCH", "PG_BENCH", "PG_MUTANT", "SOAK", "LINEARIZABILITY_DIR", "REPLAY",
		"REPLAY_SKIP_TOKENS", "BOLTSTORE_TEST_HOLD", "CRASH_ROUNDS":
		return true
	}
	return strings.HasPrefix(name, Prefix+"REQUIRE_")
}

// field is one configuration variable of Config, found by reflection, so
// every field with an env tag is known without a list to keep in step.
type field struct {
	Name    string // the full variable name, Prefix included
	GoName  string // the struct field's name, as caarlos0/env reports it
	Default string
	Help    string
	Secret  bool // tagged secret:"true": never printed
	Type    reflect.Type
	Index   []int // for reflect.Value.FieldByIndex
}

// fields lists Config's variables in declaration order, descending into
// nested structs (with their envPrefix) the way caarlos0/env does.
func fields() []field {
	var out []field
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			idx := append(slices.Clone(index), i)
			name, ok := f.Tag.Lookup("env")
			if !ok {
				if f.Type.Kind() == reflect.Struct && f.IsExported() {
					walk(f.Type, prefix+f.Tag.Get("envPrefix"), idx)
				}
				continue
			}
			name, _, _ = strings.Cut(name, ",")
			out = append(out, field{
				Name: Prefix + prefix + name, GoName: f.Name,
				Default: f.Tag.Get("envDefault"), Help: f.Tag.Get("help"),
				Secret: f.Tag.Get("secret") == "true", Type: f.Type, Index: idx,
			})
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return out
}

// fieldByName finds a variable by its Go field name.
func fieldByName(goName string) (field, bool) {
	for _, f := range fields() {
		if f.GoName == goName {
			return f, true
		}
	}
	return field{}, false
}

// Known reports whether name is a FENCEGATE_* variable fencegate reads,
// in the server (Config) or in the client commands (ClientVars).
func Known(name string) bool {
	return slices.ContainsFunc(fields(), func(f field) bool { return f.Name == name }) ||
		slices.ContainsFunc(ClientVars, func(v Var) bool { return v.Name == name })
}

// checkKnown refuses FENCEGATE_* variables fencegate does not read: a typo
// such as FENCEGATE_STOR=memory: would otherwise be ignored and the
// default store used.
func checkKnown(environ map[string]string) error {
	var unknown []string
	for k := range environ {
		if strings.HasPrefix(k, Prefix) && !Known(k) && !testSwitch(k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	var errs []error
	for _, k := range unknown {
		msg := k + " is not a fencegate variable"
		if s := suggest(k); s != "" {
			msg += "; did you mean " + s + "?"
		}
		errs = append(errs, errors.New(msg+" ('fencegate env' lists them all)"))
	}
	return errors.Join(errs...)
}

// notEmpty are the variables that, set to an empty value, would silently
// give the deployment less than it asked for, so an empty value is refused
// rather than read as unset (the rule for every other variable): an empty
// FENCEGATE_API_TOKEN or FENCEGATE_ACCESS_FILE would open the lease API to
// anyone, an empty client CA bundle would turn mutual TLS off, empty rules
// would let clients name the resource of every write (the Fencing-Resource
// fallback), and an empty FENCEGATE_STORE would put leases in a file of
// this process instead of the store other gates share. A Kubernetes Secret
// with an empty key, or a template whose value is missing, gives exactly
// that.
var notEmpty = []struct{ goName, unset string }{
	{"APIToken", "no bearer token (a lease API open to every client, unless FENCEGATE_ACCESS_FILE is set)"},
	{"AccessFile", "no access file (a lease API open to every client, unless FENCEGATE_API_TOKEN is set)"},
	{"APITLSClientCA", "no mutual TLS (any client that reaches the lease API may call it)"},
	{"ProxyTLSClientCA", "no mutual TLS (any client that reaches the gate may write through it)"},
	{"Rules", "no rules (clients then name each write's resource in Fencing-Resource)"},
	{"RulesFile", "no rules file (clients then name each write's resource in Fencing-Resource)"},
	{"Store", "the default store, a file of this process's own"},
}

// checkNotEmpty refuses the notEmpty variables set to an empty value.
func checkNotEmpty(environ map[string]string) error {
	var errs []error
	for _, v := range notEmpty {
		f, _ := fieldByName(v.goName)
		if val, ok := environ[f.Name]; ok && strings.TrimSpace(val) == "" {
			errs = append(errs, fmt.Errorf("%s is set but empty: give it a value, or unset it for %s", f.Name, v.unset))
		}
	}
	return errors.Join(errs...)
}

// suggest is the known variable nearest to name by edit distance, or ""
// when none is near enough to be a likely typo.
func suggest(name string) string {
	names := make([]string, 0)
	for _, f := range fields() {
		names = append(names, f.Name)
	}
	for _, v := range ClientVars {
		names = append(names, v.Name)
	}
	best, bestDist := "", 0
	for _, n := range names {
		d := levenshtein.ComputeDistance(name, n)
		if best == "" || d < bestDist {
			best, bestDist = n, d
		}
	}
	// A third of the part after the prefix, at least 2: FENCEGATE_STOR
	// and FENCEGATE_LOGLEVEL are typos, FENCEGATE_COLOR is not one of
	// FENCEGATE_STORE.
	if bestDist > max(2, (len(name)-len(Prefix))/3) {
		return ""
	}
	return best
}

// Setting is one variable of the effective configuration, for display.
type Setting struct {
	Name  string
	Value string // redacted when secret
	Set   bool   // given in the environment, rather than the default
}

// Effective lists every variable of c in declaration order with its value
// for display: secrets (API_TOKEN) are shown only as set or not, and any
// password in a URL is hidden. environ says which were set.
func (c Config) Effective(environ []string) []Setting {
	set := map[string]bool{}
	for _, kv := range environ {
		if k, _, ok := strings.Cut(kv, "="); ok {
			set[k] = true
		}
	}
	v := reflect.ValueOf(c)
	var out []Setting
	for _, f := range fields() {
		s := Setting{Name: f.Name, Set: set[f.Name]}
		fv := v.FieldByIndex(f.Index).Interface()
		switch x := fv.(type) {
		case time.Duration:
			s.Value = x.String()
		case *bool: // unset means the default depends on other settings
			s.Value = "auto"
			if x != nil {
				s.Value = fmt.Sprint(*x)
			}
		case *int: // unset means the default depends on other settings: MaxConnsPerClient's on MaxConns
			s.Value = fmt.Sprintf("auto (%d)", c.ConnsPerClient())
			if x != nil {
				s.Value = fmt.Sprint(*x)
			}
		default:
			s.Value = fmt.Sprint(x)
		}
		switch {
		case f.Secret && s.Value != "":
			s.Value = "(redacted)"
		default:
			s.Value = RedactURL(s.Value)
		}
		out = append(out, s)
	}
	return out
}

// RedactURL hides the password of a URL (user:pass@) and the values of
// query parameters that carry credentials (password, token, secret, ...).
// Anything that is not a URL with a scheme is returned as is.
func RedactURL(s string) string { return redact.URL(s) }
