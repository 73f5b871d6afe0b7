// Package failrecorder is a test helper: a testing.TB stand-in that records
// a failure instead of failing the test, so that a test can run a rapid
// property on a deliberately broken subject and assert that it catches it.
package failrecorder

import (
	"fmt"
	"strings"
	"testing"
)

// Recorder passes Name, Helper, Cleanup and the rest of testing.T through
// to T, and records Error, Fatal, Fail and their kin instead of reporting
// them. Fatal and FailNow record and return, without stopping the
// goroutine: use it with callers that report a failure as their last step,
// as rapid.Check does. Not safe for concurrent use.
type Recorder struct {
	*testing.T
	failed bool
	report strings.Builder
}

// New returns a Recorder over t.
func New(t *testing.T) *Recorder { return &Recorder{T: t} }

// Report is what was logged and every failure's message, in order.
func (r *Recorder) Report() string { return r.report.String() }

func (r *Recorder) Errorf(f string, a ...any) {
	r.failed = true
	fmt.Fprintf(&r.report, f+"\n", a...)
}
func (r *Recorder) Error(a ...any)            { r.failed = true; fmt.Fprintln(&r.report, a...) }
func (r *Recorder) Fatalf(f string, a ...any) { r.Errorf(f, a...) }
func (r *Recorder) Fatal(a ...any)            { r.Error(a...) }
func (r *Recorder) Fail()                     { r.failed = true }
func (r *Recorder) FailNow()                  { r.failed = true }
func (r *Recorder) Failed() bool              { return r.failed }
func (r *Recorder) Log(a ...any)              { fmt.Fprintln(&r.report, a...) }
func (r *Recorder) Logf(f string, a ...any)   { fmt.Fprintf(&r.report, f+"\n", a...) }
