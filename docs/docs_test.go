package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// pages are the documents the tests check: the README and every docs page.
func pages(t *testing.T) []string {
	t.Helper()
	md, err := filepath.Glob("*.md")
	if err != nil || len(md) == 0 {
		t.Fatalf("no docs pages: %v", err)
	}
	return append([]string{"../README.md"}, md...)
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestREADMEIsShort(t *testing.T) {
	if n := strings.Count(read(t, "../README.md"), "\n"); n > 300 {
		t.Errorf("README.md has %d lines, want at most 300: move reference text into docs/", n)
	}
}

// slug is GitHub's anchor for a heading: lower case, punctuation other than
// '-' and '_' dropped, spaces as '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the anchors of a Markdown page's headings (outside code
// blocks), with GitHub's -1, -2 suffixes for repeats.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		s := slug(strings.TrimSpace(strings.TrimLeft(line, "#")))
		if n := seen[s]; n > 0 {
			out[s+"-"+string(rune('0'+n))] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinksResolve checks every relative link of the README and the docs
// pages: the file exists inside the repository, and an anchor names a
// heading of its page.
func TestLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages(t) {
		text := read(t, page)
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			abs, err := filepath.Abs(path)
			if err != nil {
				t.Fatal(err)
			}
			if abs != root && !strings.HasPrefix(abs, root+string(filepath.Separator)) {
				t.Errorf("%s: link %q leaves the repository", page, target)
				continue
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %q: %v", page, target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(read(t, path))[anchor] {
				t.Errorf("%s: link %q: no heading with anchor #%s in %s", page, target, anchor, path)
			}
		}
	}
}

// TestSelfContained keeps the documentation free of references to files
// that are not in the repository (the project's design notes live
// elsewhere).
func TestSelfContained(t *testing.T) {
	for _, page := range pages(t) {
		text := read(t, page)
		for _, word := range []string{"DESIGN.md", "DESIGN §", "DESIGN's", "see DESIGN"} {
			if strings.Contains(text, word) {
				t.Errorf("%s mentions %q, a file outside the repository", page, word)
			}
		}
	}
}
