package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestUnknownVariableIsRefusedWithASuggestion(t *testing.T) {
	for _, tc := range []struct {
		env, want, notWant string
	}{
		{"FENCEGATE_STOR=memory:", "did you mean FENCEGATE_STORE?", ""},
		{"FENCEGATE_LOGLEVEL=debug", "did you mean FENCEGATE_LOG_LEVEL?", ""},
		{"FENCEGATE_UPSTREM=http://127.0.0.1:9", "did you mean FENCEGATE_UPSTREAM?", ""},
		{"FENCEGATE_COLOR=blue", "FENCEGATE_COLOR is not a fencegate variable", "did you mean"},
	} {
		_, err := Load([]string{tc.env})
		if err == nil {
			t.Errorf("%s: accepted", tc.env)
			continue
		}
		name, _, _ := strings.Cut(tc.env, "=")
		if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not name it and say %q", tc.env, err, tc.want)
		}
		if tc.notWant != "" && strings.Contains(err.Error(), tc.notWant) {
			t.Errorf("%s: error %q should not say %q", tc.env, err, tc.notWant)
		}
	}
	// Client-side variables and other programs' variables are not refused.
	if _, err := Load([]string{"FENCEGATE_API_URL=http://127.0.0.1:7070", "FENCEGATEWAY=x", "OTEL_SERVICE_NAME=x",
		"FENCEGATE_REQUIRE_VALKEY=1", "FENCEGATE_QUICK=1"}); err != nil {
		t.Fatalf("client, test-suite or foreign variables refused: %v", err)
	}
}

// badValues are invalid values for the string variables, which have no
// type to make one up from. A new string field fails
// TestEveryConfigErrorNamesItsVariable until it has an entry here; nil
// means every string is accepted at Load, and the reason is checked
// elsewhere.
var badValues = map[string][]string{
	"FENCEGATE_API_ADDR":            {"7070", "127.0.0.1:99999", "127.0.0.1:http"},
	"FENCEGATE_API_TOKEN":           {"secret\n", "two words"},
	"FENCEGATE_PROXY_ADDR":          {"8080", "[::1]:65536"},
	"FENCEGATE_UPSTREAM":            {"ftp://x", "127.0.0.1:9000", "http://", "unix:run/x.sock", "unix:", "unix:/run/../x.sock", "unix:/run/x.sock?q"},
	"FENCEGATE_API_TLS_CERT":        {"cert.pem"}, // without its key
	"FENCEGATE_API_TLS_KEY":         {"key.pem"},  // without its certificate
	"FENCEGATE_API_TLS_CLIENT_CA":   {"ca.pem"},   // without the listener's pair
	"FENCEGATE_PROXY_TLS_CERT":      {"cert.pem"}, // without its key
	"FENCEGATE_PROXY_TLS_KEY":       {"key.pem"},  // without its certificate
	"FENCEGATE_PROXY_TLS_CLIENT_CA": {"ca.pem"},   // without the listener's pair
	"FENCEGATE_ACCESS_FILE":         nil,          // read at start-up; cmd/fencegate's access tests cover it
	"FENCEGATE_STORE":               {"mysql://x", "file:", "memory", "valkey://"},
	"FENCEGATE_PG_SCHEMA":           {"Bad-Name", "1st"},
	"FENCEGATE_KEY_PREFIX":          {"a{b}", "x y"},
	"FENCEGATE_VALKEY_CA_FILE":      nil, // read at start-up; cmd/fencegate's check test covers it
	"FENCEGATE_RULES":               nil, // parsed at start-up; cmd/fencegate's check test covers it
	"FENCEGATE_RULES_FILE":          nil, // read at start-up; cmd/fencegate's check test covers it
	"FENCEGATE_LOG_FORMAT":          {"xml"},
	"FENCEGATE_BARRIER":             {"global", "Shared"},
	"FENCEGATE_GATE_ID":             {"a b", "gate/1"},
	"FENCEGATE_AUDIT_LOG":           {"sometimes", "0", "1.5", "-0.1", "NaN"},
	"FENCEGATE_LOG_LEVEL":           {"loud"},
}

// TestEveryConfigErrorNamesItsVariable goes over every field of Config:
// a value of the wrong shape for its type (and each bad value listed for
// strings) is refused with an error naming the variable, saying what it
// accepts, and not quoting Go's parser.
func TestEveryConfigErrorNamesItsVariable(t *testing.T) {
	// The proxy listener is validated only with the gate on.
	base := []string{"FENCEGATE_UPSTREAM=http://127.0.0.1:9000"}
	for _, f := range fields() {
		var bad []string
		switch {
		case f.Type == reflect.TypeFor[time.Duration]():
			bad = []string{"soon", "10", "-1s"}
		case f.Type.Kind() == reflect.Bool, f.Type == reflect.TypeFor[*bool]():
			bad = []string{"yes", "maybe"}
		case f.Type.Kind() == reflect.Int, f.Type == reflect.TypeFor[*int]():
			bad = []string{"lots", "1.5", "-1"}
		case f.Type.Kind() == reflect.String:
			vs, ok := badValues[f.Name]
			if !ok {
				t.Errorf("%s: add its invalid values to badValues", f.Name)
			}
			bad = vs
		default:
			t.Errorf("%s: no invalid values for type %v", f.Name, f.Type)
		}
		for _, v := range bad {
			env := append([]string{f.Name + "=" + v}, base...)
			if f.Name == "FENCEGATE_UPSTREAM" {
				env = env[:1]
			}
			_, err := Load(env)
			if err == nil {
				t.Errorf("%s=%q: accepted", f.Name, v)
				continue
			}
			msg := err.Error()
			if !strings.Contains(msg, f.Name+":") || !strings.Contains(msg, "accepts") {
				t.Errorf("%s=%q: error %q does not name the variable and what it accepts", f.Name, v, msg)
			}
			for _, leak := range []string{"strconv", "invalid syntax", "parse error on field", "time: ", "*bool", "a valid "} {
				if strings.Contains(msg, leak) {
					t.Errorf("%s=%q: error %q quotes Go internals (%q)", f.Name, v, msg, leak)
				}
			}
			if f.Secret && strings.Contains(msg, v) {
				t.Errorf("%s: error %q shows the secret", f.Name, msg)
			}
		}
	}
}

func TestEffectiveRedactsSecrets(t *testing.T) {
	environ := []string{"FENCEGATE_API_TOKEN=s3cret-token", "FENCEGATE_STORE=valkeys://u:hunter2@h:6379/0",
		"FENCEGATE_UPSTREAM=http://admin:pa55@127.0.0.1:9000/x?access_token=abc&q=1"}
	c, err := Load(environ)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Setting{}
	for _, s := range c.Effective(environ) {
		got[s.Name] = s
		for _, secret := range []string{"s3cret-token", "hunter2", "pa55", "abc"} {
			if strings.Contains(s.Value, secret) {
				t.Errorf("%s = %q shows a secret", s.Name, s.Value)
			}
		}
	}
	if len(got) != len(Help()) {
		t.Errorf("Effective lists %d variables, Help %d", len(got), len(Help()))
	}
	if s := got["FENCEGATE_API_TOKEN"]; s.Value != "(redacted)" || !s.Set {
		t.Errorf("API token shown as %+v", s)
	}
	if s := got["FENCEGATE_STORE"]; s.Value != "valkeys://u:xxxxx@h:6379/0" || !s.Set {
		t.Errorf("store shown as %+v", s)
	}
	if s := got["FENCEGATE_UPSTREAM"]; !strings.Contains(s.Value, "q=1") || !strings.Contains(s.Value, "127.0.0.1:9000") {
		t.Errorf("upstream shown as %+v", s)
	}
	if s := got["FENCEGATE_DEFAULT_TTL"]; s.Value != "30s" || s.Set {
		t.Errorf("default TTL shown as %+v", s)
	}
}

// TestDocumentedVariablesAreAccepted: every FENCEGATE_* variable the docs
// name is one Load accepts, a server or client variable or a switch of the
// test suite (which a shell set up for the tests may still hold when it
// runs fencegate), except the misspellings the docs quote to show the
// error they get.
func TestDocumentedVariablesAreAccepted(t *testing.T) {
	quotedTypos := map[string]bool{"FENCEGATE_STOR": true, "FENCEGATE_X": true}
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range append(files, "../README.md") {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range regexp.MustCompile(`FENCEGATE_[A-Z0-9_]*[A-Z0-9]\b`).FindAllString(string(b), -1) {
			if quotedTypos[name] {
				continue
			}
			if _, err := Load([]string{name + "=1"}); err != nil && strings.Contains(err.Error(), "not a fencegate variable") {
				t.Errorf("%s names %s, which fencegate refuses: %v", file, name, err)
			}
		}
	}
}
