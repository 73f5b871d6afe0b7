package mdblock

import (
	"slices"
	"testing"
)

const page = "# Page\n\n## One\n\n```sh\necho a\n```\n\ntext\n\n```text\nout\n```\n\n```sh\necho b\necho c\n```\n\n### Deeper\n\n```sh\necho d\n```\n\n## Two\n\n```sh\necho e\n```\n"

func TestSection(t *testing.T) {
	one, ok := Section(page, "## One")
	if !ok {
		t.Fatal("## One not found")
	}
	if got, want := Shell(one), []string{"echo a\n", "echo b\necho c\n", "echo d\n"}; !slices.Equal(got, want) {
		t.Errorf("## One's blocks %q, want %q (a deeper heading stays in the section, the next one of its level ends it)", got, want)
	}
	if _, ok := Section(page, "## Three"); ok {
		t.Error("## Three found in a page without it")
	}
}

func TestShell(t *testing.T) {
	if got, want := Shell(page), []string{"echo a\n", "echo b\necho c\n", "echo d\n", "echo e\n"}; !slices.Equal(got, want) {
		t.Errorf("blocks %q, want %q (only sh blocks, in order)", got, want)
	}
	if got := Shell("no blocks\n"); got != nil {
		t.Errorf("blocks %q of a text without any", got)
	}
}
