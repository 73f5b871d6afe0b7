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
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/demo\n\ngo 1.22")
	write("demo_test.go", `package demo

import "testing"

func TestGood(t *testing.T) { t.Log("quiet") }
func TestBad(t *testing.T)  { t.Log("why it failed"); t.Fail() }
func TestSkip(t *testing.T) { t.Skip("not here") }`)
	cmd := exec.Command("go", "test", "-json", "./...")
	cmd.Dir = dir
	raw, _ := cmd.Output() // exits 1: TestBad fails
	var out strings.Builder
	if err := run(strings.NewReader(string(raw)), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"PASS example.com/demo TestGood",
		"FAIL example.com/demo TestBad",
		"SKIP example.com/demo TestSkip",
		"why it failed",
		"FAIL\texample.com/demo", // go test's closing line for the package
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
// a panic in another goroutine ends the test binary) has no end event; its
// output and the panic are shown all the same.
func TestTimedOutTestOutput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/hang\n\ngo 1.22")
	write("hang_test.go", `package hang

import (
	"testing"
	"time"
)

func TestHangs(t *testing.T) { t.Log("last words"); time.Sleep(time.Minute) }`)
	cmd := exec.Command("go", "test", "-json", "-timeout", "2s", "./...")
	cmd.Dir = dir
	raw, _ := cmd.Output() // exits 1: the test times out
	var out strings.Builder
	if err := run(strings.NewReader(string(raw)), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"last words", "TestHangs", "test timed out"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
