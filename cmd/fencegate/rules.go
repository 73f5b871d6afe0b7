package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/internal/configfile"
	"github.com/fencegate/fencegate/proxy"
)

// loadRules reads and parses the write gate's route rules from
// FENCEGATE_RULES or FENCEGATE_RULES_FILE, and returns them with the text
// it parsed. An error names the variable the rules came from, and the
// file for FENCEGATE_RULES_FILE. The file is read as configfile.Read
// reads (a regular file of at most configfile.MaxBytes), at start-up
// (check, serve) as on reload.
func loadRules(cfg config.Config) ([]proxy.Rule, string, error) {
	text, from := cfg.Rules, "FENCEGATE_RULES"
	if cfg.RulesFile != "" {
		b, err := configfile.Read(cfg.RulesFile)
		if err != nil {
			return nil, "", fmt.Errorf("FENCEGATE_RULES_FILE: %w", err)
		}
		text, from = string(b), "FENCEGATE_RULES_FILE "+cfg.RulesFile
	}
	rules, err := proxy.ParseRules(text)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", from, err)
	}
	return rules, text, nil
}

// unendedLastRule returns the line number of text's last line when that
// line holds a rule (or what does not parse as one) without a line end
// after it, or 0: the shape reloadRules refuses.
func unendedLastRule(text string) int {
	last := text[strings.LastIndexByte(text, '\n')+1:]
	if tail, err := proxy.ParseRules(last); err != nil || len(tail) > 0 {
		return strings.Count(text, "\n") + 1
	}
	return 0
}

// warnUnendedRules logs at start-up, once, that the rules file's last rule
// (at line, 0: none; configured.unendedRule) has no line end: it is taken
// as it is now, but every reload of the file in that shape will be refused
// (reloadRules), which an operator would otherwise learn only at the first
// SIGHUP.
func warnUnendedRules(file string, line int, log *slog.Logger) {
	if line > 0 {
		log.Warn("the rules file's last rule has no line end: it is in force, but a reload (SIGHUP) of the file in this shape will be refused; end every line with a newline",
			"file", file, "line", line)
	}
}

// noRules refuses, at start-up, rules that were given and hold none
// (comments only, an empty file: most likely a file not yet written, or a
// template's variable left unset) when that would turn on the
// Fencing-Resource fallback: a gate without rules is one whose rules are
// not set at all, or whose FENCEGATE_RESOURCE_HEADER says what it wants.
func noRules(cfg config.Config, rules int) error {
	if rules > 0 || cfg.Upstream == "" || cfg.ResourceHeader != nil {
		return nil
	}
	what := "FENCEGATE_RULES holds"
	if cfg.RulesFile != "" {
		what = "FENCEGATE_RULES_FILE " + cfg.RulesFile + " holds"
	}
	return fmt.Errorf("%s no rules, so clients would name each write's resource in Fencing-Resource; give it rules, or unset it to run without (FENCEGATE_RESOURCE_HEADER=true or false to say which)", what)
}

// reloadRules re-reads FENCEGATE_RULES_FILE into gate (SIGHUP): rules that
// do not load leave the ones in force, and the error names the file. Two
// shapes of a file caught while it is rewritten in place are refused too:
//
//   - one with no rules at all while rules are in force: far more often a
//     file truncated and not yet written than a wish to drop every rule,
//     which would also turn on the Fencing-Resource header's fallback
//     (FENCEGATE_RESOURCE_HEADER unset) and let clients name their writes'
//     resources. A restart without the variable drops them all (start-up
//     refuses a file with no rules too: noRules).
//   - one whose last rule's line has no line end: a file cut off inside a
//     line may still parse, its last rule then another rule than the one
//     written ("fence job:{id}:data" read as "fence job:{id}", a write
//     fenced on another resource; "fence strict job:{id}" as "fence st",
//     no longer strict). Start-up, which reads a file that is not
//     being written, takes such a file as it is, with a warning
//     (warnUnendedRules).
func reloadRules(cfg config.Config, gate *proxy.Gate, log *slog.Logger) error {
	rules, text, err := loadRules(cfg)
	if err != nil {
		return err
	}
	if n := len(gate.Rules()); len(rules) == 0 && n > 0 {
		return fmt.Errorf("FENCEGATE_RULES_FILE %s holds no rules while %d are in force (a file being rewritten? replace it whole, by a rename); to run without rules, unset it and restart", cfg.RulesFile, n)
	}
	if line := unendedLastRule(text); line > 0 {
		return fmt.Errorf("FENCEGATE_RULES_FILE %s: its last rule (line %d) has no line end, as in a file cut off while it is rewritten; end every line with a newline and replace the file whole, by a rename", cfg.RulesFile, line)
	}
	if err := gate.SetRules(rules); err != nil {
		return err
	}
	log.Info("write gate rules reloaded", "file", cfg.RulesFile, "rules", len(rules))
	return nil
}
