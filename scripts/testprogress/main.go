// Command testprogress turns `go test -json` output into progress a person
// can follow on a slow machine: go test's own package lines (ok, FAIL, ?,
// build errors) pass through unchanged, every top-level test that ends is
// shown on one line with its package and duration, and a failing test's
// whole output is shown when it fails. It exits 0; the test result is go
// test's exit status (scripts/test.sh runs it under pipefail). Each package
// is also announced as its test binary starts.
//
//	go test -json ./... | go run ./scripts/testprogress
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of test2json output (go doc test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Elapsed    float64
	Output     string
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	w := bufio.NewWriter(out)
	defer w.Flush()
	// Output of tests still running, by package and test, shown only if
	// the test fails.
	pending := map[string]*strings.Builder{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(w, "%s\n", line) // not test2json: pass it on
			w.Flush()
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(w, e.Output)
		case e.Test == "" && e.Action == "start":
			// A package's test binary was built and starts: progress while
			// the slow packages still compile.
			fmt.Fprintf(w, "    START %s\n", e.Package)
		case e.Test == "" && e.Action == "output":
			// Package-level: the closing ok/FAIL lines, panics, TestMain.
			fmt.Fprint(w, e.Output)
		case e.Test == "" && e.Action == "fail":
			// The package failed with tests still running (a timeout, a
			// panic, os.Exit): no event ends them, so show their output.
			flushPending(w, pending, e.Package+" ")
		case e.Test != "" && e.Action == "output":
			b := pending[key]
			if b == nil {
				b = &strings.Builder{}
				pending[key] = b
			}
			b.WriteString(e.Output)
		case e.Test != "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			b := pending[key]
			delete(pending, key)
			if e.Action == "fail" && b != nil {
				fmt.Fprint(w, b.String())
			}
			if !strings.Contains(e.Test, "/") {
				fmt.Fprintf(w, "    %-4s %s %s (%.2fs)\n", strings.ToUpper(e.Action), e.Package, e.Test, e.Elapsed)
			}
		}
		w.Flush()
	}
	flushPending(w, pending, "") // the stream ended mid-test
	return sc.Err()
}

// flushPending shows, and forgets, the output of the tests still running
// whose key starts with prefix.
func flushPending(w io.Writer, pending map[string]*strings.Builder, prefix string) {
	for key, b := range pending {
		if strings.HasPrefix(key, prefix) {
			fmt.Fprintf(w, "--- %s did not end:\n%s", key, b.String())
			delete(pending, key)
		}
	}
}
