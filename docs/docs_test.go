package docs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/fencegate/fencegate/internal/freeport"
	"github.com/fencegate/fencegate/internal/mdblock"
)

// pages are the documents the tests check: the README, every docs page
// and the examples' READMEs.
func pages(t *testing.T) []string {
	t.Helper()
	md, err := filepath.Glob("*.md")
	if err != nil || len(md) == 0 {
		t.Fatalf("no docs pages: %v", err)
	}
	examples, err := filepath.Glob("../examples/*/README.md")
	if err != nil || len(examples) == 0 {
		t.Fatalf("no examples' READMEs: %v", err)
	}
	return append(append([]string{"../README.md"}, md...), examples...)
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
	if n := strings.Count(read(t, "../README.md"), "\n"); n > 130 {
		t.Errorf("README.md has %d lines, want at most 130: it is the front door (what fencegate is, the two commands, the quick start, the map of docs/); move reference text into docs/", n)
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

// shellBlocks returns the ```sh blocks of the section of page whose heading
// starts with heading, up to the next heading of the same level.
func shellBlocks(t *testing.T, page, heading string) []string {
	t.Helper()
	section, ok := mdblock.Section(read(t, page), heading)
	if !ok {
		t.Fatalf("%s has no section %q", page, heading)
	}
	return mdblock.Shell(section)
}

// TestTLSRecipe runs tls.md's test certificate recipe as written: its two
// shell blocks in one bash -e, in a temporary directory, with a fencegate
// built from this checkout on the PATH; only the port changes, to a free
// one. openssl makes the certificates; curl and the CLI must reach the
// lease API over HTTPS with the client certificate (the access file knows
// the client by its URI SAN) and be refused without it.
func TestTLSRecipe(t *testing.T) {
	for _, tool := range []string{"bash", "openssl", "curl", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (scripts/test.sh installs it)", tool)
		}
	}
	blocks := shellBlocks(t, "tls.md", "## Test certificates with openssl")
	if len(blocks) != 2 {
		t.Fatalf("the recipe has %d shell blocks, want 2", len(blocks))
	}
	script := strings.Join(blocks, "\n")
	if !strings.Contains(script, ":7443") {
		t.Fatalf("the recipe does not use port 7443:\n%s", script)
	}
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	script = strings.ReplaceAll(script, ":7443", ":"+strconv.Itoa(port))

	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "fencegate"), "../cmd/fencegate").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	cmd.Dir = work
	env := []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCEGATE_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	// Its own process group, ended at cleanup: a failing line would leave
	// the background fencegate running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(work, "tls.log"))
		t.Fatalf("the recipe failed: %v\n%s\nfencegate's log:\n%s", err, text, log)
	}
	for _, want := range []string{
		`{"resource":"job:1","owner":"worker-a","token":`, // curl with the client certificate
		"refused, curl exit",                              // curl without one
		`"lease":{"resource":"job:1","owner":"worker-a"`,  // the CLI's status over mutual TLS
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the recipe's output lacks %s:\n%s", want, text)
		}
	}
}
