package failrecorder_test

import (
	"testing"

	"github.com/fencegate/fencegate/internal/failrecorder"
)

func TestRecordsInsteadOfFailing(t *testing.T) {
	rec := failrecorder.New(t)
	rec.Logf("step %d", 1)
	if rec.Failed() {
		t.Fatal("a log line alone counts as a failure")
	}
	rec.Fatalf("broken at %d", 2)
	rec.Error("and", "more")
	if !rec.Failed() {
		t.Fatal("Fatalf was not recorded as a failure")
	}
	if got, want := rec.Report(), "step 1\nbroken at 2\nand more\n"; got != want {
		t.Fatalf("report %q, want %q", got, want)
	}
	if t.Failed() {
		t.Fatal("the recorder failed the test it wraps")
	}
}
