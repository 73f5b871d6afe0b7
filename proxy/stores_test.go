package proxy

import (
	"path/filepath"
	"testing"

	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// forEachStore runs test against a gate in front of each embedded store:
// memory and file (bbolt), both on a fake clock.
func forEachStore(t *testing.T, test func(t *testing.T, e *env)) {
	t.Run("memory", func(t *testing.T) {
		clock := newFakeClock()
		test(t, newEnvStore(t, testRules, memstore.New(memstore.Options{Clock: clock}), clock))
	})
	t.Run("file", func(t *testing.T) {
		clock := newFakeClock()
		st, err := boltstore.Open(filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		test(t, newEnvStore(t, testRules, st, clock))
	})
}
