package linear_test

import (
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/fencegate/fencegate/fencing/fencingtest/linear"
)

// TestReplay re-checks a saved history, for investigating a counterexample:
//
//	FENCEGATE_REPLAY=/tmp/fencegate-linearizability/NAME.json go test -run TestReplay -v ./fencing/fencingtest/linear
//
// It is skipped without FENCEGATE_REPLAY.
func TestReplay(t *testing.T) {
	path := os.Getenv("FENCEGATE_REPLAY")
	if path == "" {
		t.Skip("set FENCEGATE_REPLAY to a saved history")
	}
	ops, err := linear.LoadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	skip := os.Getenv("FENCEGATE_REPLAY_SKIP_TOKENS") != "0"
	v := linear.CheckHistory(linear.WithCandidates(ops), skip, 5*time.Minute, "", "replay")
	if v.Result != porcupine.Ok {
		t.Fatalf("%s (%d calls): %s\n%s", path, len(ops), v.Result, v.Counterexample)
	}
}
