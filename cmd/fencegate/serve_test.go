package main

import (
	"testing"
	"time"

	"github.com/fencegate/fencegate/proxy"
)

// TestTimeoutGraceZeroTurnsItOff: FENCEGATE_TIMEOUT_GRACE=0s means no
// grace, not proxy's default for a zero Options.TimeoutGrace.
func TestTimeoutGraceZeroTurnsItOff(t *testing.T) {
	if got := timeoutGrace(0); got != proxy.NoGrace {
		t.Fatalf("timeoutGrace(0) = %v, want proxy.NoGrace", got)
	}
	if got := timeoutGrace(5 * time.Second); got != 5*time.Second {
		t.Fatalf("timeoutGrace(5s) = %v", got)
	}
}
