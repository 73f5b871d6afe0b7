package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/internal/certs"
	"github.com/fencegate/fencegate/leaseapi/access"
	"github.com/fencegate/fencegate/proxy"
)

// openAPIWarning is what serve logs and check prints when
// config.Config.APIOpenBeyondLoopback.
const openAPIWarning = "the lease API listens beyond loopback without authentication: any client that reaches it can take and release every lease; set FENCEGATE_API_TOKEN or FENCEGATE_ACCESS_FILE"

// configured is a configuration validate accepted, with what it loaded.
type configured struct {
	cfg   config.Config
	rules []proxy.Rule // the route rules, when FENCEGATE_RULES or FENCEGATE_RULES_FILE is set
	// unendedRule is the line of FENCEGATE_RULES_FILE's last rule when it
	// has no line end (taken, but reloads refuse the file in that shape:
	// reloadRules), else 0.
	unendedRule int
	access      *access.File // the lease API's access file; nil without FENCEGATE_ACCESS_FILE
}

// validate checks the configuration as check and serve both do before
// anything starts: the FENCEGATE_* variables, the route rules
// (FENCEGATE_RULES or the file FENCEGATE_RULES_FILE names, checked even
// while the write gate is off), the Valkey CA file, the listeners' TLS
// files and the lease API's access file. Its error exits 2 (exitUsage).
// What only starting can find (a port in use, a store that cannot be
// opened) is not a configuration error: serve fails on it later, with
// status 1.
func validate(environ []string) (configured, error) {
	invalid := func(err error) (configured, error) {
		return configured{}, withExit(exitUsage, fmt.Errorf("invalid configuration:\n%w", err))
	}
	cfg, err := config.Load(environ)
	if err != nil {
		return invalid(err)
	}
	c := configured{cfg: cfg}
	if cfg.Rules != "" || cfg.RulesFile != "" {
		var text string
		if c.rules, text, err = loadRules(cfg); err != nil {
			return invalid(err)
		}
		if err := noRules(cfg, len(c.rules)); err != nil {
			return invalid(err)
		}
		if cfg.RulesFile != "" {
			c.unendedRule = unendedLastRule(text)
		}
	}
	if _, err := valkeyTLS(cfg.ValkeyCAFile); err != nil {
		return invalid(err)
	}
	for _, l := range []struct{ name, cert, key, ca string }{
		{"API_TLS", cfg.APITLSCert, cfg.APITLSKey, cfg.APITLSClientCA},
		{"PROXY_TLS", cfg.ProxyTLSCert, cfg.ProxyTLSKey, cfg.ProxyTLSClientCA},
	} {
		if l.cert == "" {
			continue
		}
		if _, err := certs.New(certs.Files{CertFile: l.cert, KeyFile: l.key, ClientCAFile: l.ca}); err != nil {
			return invalid(tlsFilesError(l.name, err))
		}
	}
	if c.access, err = loadAccess(cfg, nil); err != nil {
		return invalid(err)
	}
	return c, nil
}

// check validates the configuration as serve does (validate), without
// opening the store or a listener. It prints the effective configuration,
// secrets redacted, and returns nil when serve would start with it, else
// an error that exits 2. A store that is down or a port in use is not a
// configuration error: check does not contact the store or listen.
func check(environ []string, stdout io.Writer) error {
	c, err := validate(environ)
	if err != nil {
		return err
	}
	cfg, rules, accessFile, unended := c.cfg, c.rules, c.access, c.unendedRule

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VARIABLE\tVALUE\tFROM")
	for _, s := range cfg.Effective(environ) {
		from := "default"
		if s.Set {
			from = "environment"
		}
		if s.Name == "FENCEGATE_RESOURCE_HEADER" && !s.Set {
			// What the gate resolves it to (config.ResourceHeaderOn), as
			// MAX_CONNS_PER_CLIENT shows its own: "auto" is not a value
			// the variable accepts.
			s.Value = fmt.Sprintf("auto (%t)", cfg.ResourceHeaderOn(len(rules)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, oneLine(s.Value), from)
	}
	for _, v := range config.ClientVars {
		for _, kv := range environ {
			if val, ok := strings.CutPrefix(kv, v.Name+"="); ok {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Name, config.RedactURL(val), "environment (client commands only)")
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case cfg.Upstream == "":
		fmt.Fprintln(stdout, "\nwrite gate: off (FENCEGATE_UPSTREAM is unset)")
		if len(rules) > 0 {
			fmt.Fprintln(stdout, "warning: the route rules are valid but ignored while the write gate is off")
		}
	default:
		fmt.Fprintf(stdout, "\nwrite gate: on, %d route rules\n", len(rules))
		for _, r := range rules {
			desc := r.Action.String()
			if r.Template != "" {
				desc += " " + r.Template
			}
			if r.Strict {
				desc += " (strict)"
			}
			methods := "*"
			if r.Methods != nil {
				methods = strings.Join(r.Methods, ",")
			}
			fmt.Fprintf(stdout, "  line %d: %s %s -> %s\n", r.Line, methods, r.Pattern, desc)
		}
		if unended > 0 {
			fmt.Fprintf(stdout, "warning: line %d, the rules file's last rule, has no line end: taken now, but a reload (SIGHUP) of the file in this shape is refused; end every line with a newline\n", unended)
		}
		if len(rules) == 0 && !cfg.ResourceHeaderOn(0) {
			fmt.Fprintln(stdout, "warning: no rules and FENCEGATE_RESOURCE_HEADER is false: every fenced write will be refused")
		}
	}
	if cfg.APIOpenBeyondLoopback() {
		fmt.Fprintf(stdout, "\nwarning: %s (FENCEGATE_API_ADDR %s)\n", openAPIWarning, cfg.APIAddr)
	}
	if accessFile != nil {
		p := accessFile.Policy()
		fmt.Fprintf(stdout, "\nlease API access: %d clients (%s)\n", len(p.Clients()), cfg.AccessFile)
		for _, cl := range p.Clients() {
			fmt.Fprintf(stdout, "  %s\n", cl.Describe())
		}
		if p.HasCertClients() && cfg.APITLSClientCA == "" {
			fmt.Fprintln(stdout, "warning: clients known by certificate cannot authenticate: FENCEGATE_API_TLS_CLIENT_CA is unset")
		}
	}
	_, err = fmt.Fprintln(stdout, "configuration ok")
	return err
}

// oneLine shows a multi-line value (FENCEGATE_RULES) on one table row.
func oneLine(s string) string {
	if strings.ContainsAny(s, "\n\r\t") {
		return fmt.Sprintf("%q", s)
	}
	return s
}
