package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRealGoTestOutput feeds the formatter what `go test -json` prints for
// a package with a passing, a failing and a skipped test, and checks that
// go test's closing lines survive and the failure's output is shown.
func TestRealGoTestOutput(t *testing.T) {
	got := formatGoTest(t, "example.com/demo", `package demo

import "testing"

func TestGood(t *testing.T) { t.Log("quiet") }
func TestBad(t *testing.T)  { t.Log("why it failed"); t.Fail() }
func TestSkip(t *testing.T) { t.Skip("not here") }`)
	for _, want := range []string{
		"PASS example.com/demo TestGood",
		"FAIL example.com/demo TestBad",
		"SKIP example.com/demo TestSkip",
		"why it failed",
		"FAIL\texample.com/demo", // go test's closing line for the package
		"START example.com/demo", // the package announced as it starts
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") {
		t.Errorf("a passing test's output is shown:\n%s", got)
	}
}

// TestTimedOutTestOutput: a test still running when its package fails (here
// go test's -timeout ends the test binary) has no end event; its output and
// the timeout's report are shown all the same.
func TestTimedOutTestOutput(t *testing.T) {
	got := formatGoTest(t, "example.com/hang", `package hang

import (
	"testing"
	"time"
)

func TestHangs(t *testing.T) { t.Log("last words"); time.Sleep(time.Minute) }`, "-timeout", "2s")
	for _, want := range []string{"last words", "TestHangs", "test timed out"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// formatGoTest runs `go test -json` (with args) on a module holding one
// test file and returns what run makes of its output.
func formatGoTest(t *testing.T, module, testFile string, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range map[string]string{"go.mod": "module " + module + "\n\ngo 1.22", "x_test.go": testFile} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", append(append([]string{"test", "-json"}, args...), "./...")...)
	cmd.Dir = dir
	raw, _ := cmd.Output() // exits 1: the tests fail
	var out strings.Builder
	if err := run(strings.NewReader(string(raw)), &out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}
