package fencingtest

import (
	"context"
	"errors"
	"testing"

	"github.com/fencegate/fencegate/fencing"
)

var errRaisedAtMark = errors.New("admission at the mark reported Raised")

// CheckAdmitAtTheMarkAllocs fails t if admitting a write at the resource's
// high-water mark (the gate's common case: the owner's next write with the
// token already admitted) allocates on the heap. Stores that keep their
// state in process promise that path costs no allocation; a store that
// talks to a server does not, and is not checked. The check is skipped
// under the race detector, which changes allocation counts.
func CheckAdmitAtTheMarkAllocs(t *testing.T, st fencing.Store) {
	t.Helper()
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	ctx := context.Background()
	const res = "allocs:admit:mark"
	tok := admitted(t, st, res)
	req := fencing.AdmitRequest{Resource: res, Token: tok}
	var failed error
	allocs := testing.AllocsPerRun(200, func() {
		a, err := st.Admit(ctx, req)
		if err == nil && a.Raised {
			err = errRaisedAtMark
		}
		if err != nil && failed == nil {
			failed = err
		}
	})
	if failed != nil {
		t.Fatalf("Admit at the mark: %v", failed)
	}
	if allocs != 0 {
		t.Errorf("Admit at the mark: %v allocations per call, want 0", allocs)
	}
}
