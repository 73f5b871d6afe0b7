// Package mdblock reads the shell blocks of the project's Markdown pages,
// for the tests that run a page's commands as written (the README's quick
// start, the examples' READMEs, docs/tls.md's recipe).
package mdblock

import "strings"

// Section returns the part of text under the heading line that starts with
// heading ("## Quick start", say), up to the next heading of the same
// level; false when text has no such heading.
func Section(text, heading string) (string, bool) {
	_, section, ok := strings.Cut(text, "\n"+heading)
	if !ok {
		return "", false
	}
	level := heading[:strings.IndexByte(heading, ' ')+1]
	section, _, _ = strings.Cut(section, "\n"+level)
	return section, true
}

// Shell returns the ```sh blocks of text, in order, without their fences.
func Shell(text string) []string {
	var blocks []string
	for rest := text; ; {
		_, after, ok := strings.Cut(rest, "```sh\n")
		if !ok {
			return blocks
		}
		block, tail, _ := strings.Cut(after, "```\n")
		blocks = append(blocks, block)
		rest = tail
	}
}
