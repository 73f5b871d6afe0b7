package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/proxy"
)

// TestTimeoutGraceZeroTurnsItOff: FENCEGATE_TIMEOUT_GRACE=0s means no
// grace, not proxy's default for a zero Options.TimeoutGrace.
func TestTimeoutGraceZeroTurnsItOff(t *testing.T) {
	if got := timeoutGrace(0); got != proxy.NoGrace {
		t.Fatalf("timeoutGrace(0) = %v, want proxy.NoGrace", got)
	}
	if got := timeoutGrace(5 * time.Second); got != 5*time.Second {
		t.Fatalf("timeoutGrace(5s) = %v", got)
	}
}

// TestReloadRulesRefusesALineCutShort: a rules file cut off inside its
// last line (one caught while it is rewritten in place) can still parse,
// as other rules than the ones written: "fence job:{id}:data" read as
// "fence job:{id}" fences the write on another resource, and "fence strict
// job:{id}" read as "fence st" drops the strict check. SIGHUP refuses
// such a file and the rules in force stay; the same file with its line end
// is taken, and so is a last line of comment or blanks without one.
func TestReloadRulesRefusesALineCutShort(t *testing.T) {
	const whole = "POST /jobs/{id}/finish fence strict job:{id}\nPUT /jobs/{id} fence job:{id}:data\n"
	file := filepath.Join(t.TempDir(), "rules")
	rules, err := proxy.ParseRules(whole)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("http://127.0.0.1:1")
	gate, err := proxy.New(proxy.Options{Upstream: u, Store: memstore.New(memstore.Options{}), Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{RulesFile: file}
	log := slog.New(slog.DiscardHandler)
	reload := func(text string) error {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return reloadRules(cfg, gate, log)
	}
	inForce := func() string {
		var b strings.Builder
		for _, r := range gate.Rules() {
			fmt.Fprintf(&b, "%v %s %v %v %s;", r.Methods, r.Pattern, r.Action, r.Strict, r.Template)
		}
		return b.String()
	}
	before := inForce()
	for _, cut := range []string{
		"POST /jobs/{id}/finish fence strict job:{id}\nPUT /jobs/{id} fence job:{id}",
		"POST /jobs/{id}/finish fence strict job:{id}\nPUT /jobs/{id} fence j",
		"POST /jobs/{id}/finish fence st",
		"POST /jobs/{id}/finish fence strict job:{id}; PUT /jobs/{id} pass",
	} {
		err := reload(cut)
		if err == nil || !strings.Contains(err.Error(), "no line end") || !strings.Contains(err.Error(), file) {
			t.Errorf("reload of %q: %v, want a refusal naming the file and the missing line end", cut, err)
		}
		if got := inForce(); got != before {
			t.Fatalf("after the refused reload of %q, the rules in force are %s, want %s", cut, got, before)
		}
	}
	for _, ok := range []string{whole, "PUT /jobs/{id} deny\n# end", "PUT /jobs/{id} deny\n  ", "PUT /jobs/{id} deny # no more\n"} {
		if err := reload(ok); err != nil {
			t.Errorf("reload of %q: %v", ok, err)
		}
	}
}

// TestStartWarnsOfAnUnendedRulesFile: start-up takes a rules file whose
// last rule has no line end, and says at once that reloads of it in that
// shape will be refused, rather than leaving the operator to learn it at
// the first SIGHUP.
func TestStartWarnsOfAnUnendedRulesFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules")
	for text, warned := range map[string]bool{
		"PUT /jobs/{id} fence job:{id}":        true,
		"PUT /jobs/{id} fence job:{id}\n":      false,
		"PUT /jobs/{id} fence job:{id}\n# end": false,
	} {
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := validate([]string{"FENCEGATE_RULES_FILE=" + file})
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		warnUnendedRules(file, c.unendedRule, slog.New(slog.NewTextHandler(&out, nil)))
		if got := strings.Contains(out.String(), "no line end"); got != warned {
			t.Errorf("rules file %q: warned %v, want %v (log: %q)", text, got, warned, out.String())
		}
	}
}

// TestRulesThatHoldNoneAreRefusedAtStart: rules given as a file or inline
// that hold none (empty, comments only: a file not yet written, a
// template's variable left unset) stop start-up, naming the variable:
// taken as they are, they would turn on the Fencing-Resource fallback and
// let clients name each write's resource. FENCEGATE_RESOURCE_HEADER set
// either way says what the operator wants, and is taken.
func TestRulesThatHoldNoneAreRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	empty, comments := filepath.Join(dir, "empty"), filepath.Join(dir, "comments")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(comments, []byte("# filled in by the deploy\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const up = "FENCEGATE_UPSTREAM=http://127.0.0.1:9"
	for _, c := range []struct{ rules, want string }{
		{"FENCEGATE_RULES_FILE=" + empty, "FENCEGATE_RULES_FILE " + empty + " holds no rules"},
		{"FENCEGATE_RULES_FILE=" + comments, "FENCEGATE_RULES_FILE " + comments + " holds no rules"},
		{"FENCEGATE_RULES=# to do", "FENCEGATE_RULES holds no rules"},
	} {
		if _, err := validate([]string{"FENCEGATE_STORE=memory:", up, c.rules}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.rules, err, c.want)
		}
		for _, header := range []string{"true", "false"} {
			if _, err := validate([]string{"FENCEGATE_STORE=memory:", up, c.rules, "FENCEGATE_RESOURCE_HEADER=" + header}); err != nil {
				t.Errorf("%s with FENCEGATE_RESOURCE_HEADER=%s: %v, want it taken", c.rules, header, err)
			}
		}
	}
}

// TestRulesErrorsNameTheirVariable: a rule that does not parse is reported
// under the variable it came from: FENCEGATE_RULES for rules given inline,
// FENCEGATE_RULES_FILE and the file's path for a file, at start-up
// ('fencegate check', serve) and on a reload (SIGHUP) alike, so the
// operator is not sent to a variable that is not set.
func TestRulesErrorsNameTheirVariable(t *testing.T) {
	const bad = "PUT /jobs/{id} fence job/{id}\n"
	file := filepath.Join(t.TempDir(), "rules")
	if err := os.WriteFile(file, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := validate([]string{"FENCEGATE_RULES=" + bad})
	if err == nil || !strings.Contains(err.Error(), "FENCEGATE_RULES: rules: line 1") {
		t.Errorf("inline rules: %v, want an error naming FENCEGATE_RULES and the line", err)
	}
	_, err = validate([]string{"FENCEGATE_RULES_FILE=" + file})
	if err == nil || !strings.Contains(err.Error(), "FENCEGATE_RULES_FILE "+file+": rules: line 1") {
		t.Errorf("rules file at start: %v, want an error naming FENCEGATE_RULES_FILE, the file and the line", err)
	}

	u, _ := url.Parse("http://127.0.0.1:1")
	gate, err := proxy.New(proxy.Options{Upstream: u, Store: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	err = reloadRules(config.Config{RulesFile: file}, gate, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "FENCEGATE_RULES_FILE "+file+": rules: line 1") {
		t.Errorf("rules file on reload: %v, want an error naming FENCEGATE_RULES_FILE, the file and the line", err)
	}
}

// TestStoreOpenLogged: every store kind that opens without a server logs
// "store open" with the store it opened (memory: as well as file:), so an
// operator reading the log sees which store serves.
func TestStoreOpenLogged(t *testing.T) {
	file := filepath.Join(t.TempDir(), "fencegate.db")
	for _, store := range []string{"memory:", "file:" + file} {
		var out bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&out, nil))
		st, err := openStore(t.Context(), config.Config{Store: store}, nil, log)
		if err != nil {
			t.Fatalf("%s: %v", store, err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var rec struct{ Msg, Store string }
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("%s: log line %q: %v", store, line, err)
			}
			found = found || rec.Msg == "store open" && rec.Store == store
		}
		if !found {
			t.Errorf("%s: no \"store open\" line with store=%s in the log:\n%s", store, store, out.String())
		}
	}
}
