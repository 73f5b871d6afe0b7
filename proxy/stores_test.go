package proxy

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// forEachStore runs test against a gate in front of each embedded store:
// memory and file (bbolt), both on a fake clock; and the memory store
// through a batch path and through mark readers, as the event loops admit
// with the Valkey store (on Linux, where the loops run).
func forEachStore(t *testing.T, test func(t *testing.T, e *env)) {
	t.Run("memory", func(t *testing.T) {
		clock := newFakeClock()
		test(t, newEnvStore(t, testRules, memstore.New(memstore.Options{Clock: clock}), clock))
	})
	t.Run("batched", func(t *testing.T) {
		clock := newFakeClock()
		test(t, newEnvStore(t, testRules, &batchedStore{Store: memstore.New(memstore.Options{Clock: clock})}, clock))
	})
	if newMarkedVariant != nil {
		t.Run("marked", func(t *testing.T) {
			clock := newFakeClock()
			test(t, newEnvStore(t, testRules, newMarkedVariant(memstore.New(memstore.Options{Clock: clock})), clock))
		})
	}
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

// newMarkedVariant, when set, returns st through a batch path with mark
// readers (loopmarks_linux_test.go).
var newMarkedVariant func(st fencing.Store) fencing.Store

// batchedStore is a memory store seen through a batch path: AdmitBatch
// admits one request after another, and it has no AdmitNow, so the loops
// send every fenced write to a batch, as they do with the Valkey store.
// hold, when set, makes each AdmitBatch wait until it is closed.
type batchedStore struct {
	fencing.Store
	hold    chan struct{}
	batches atomic.Int64
	items   atomic.Int64
}

var _ fencing.BatchAdmitter = (*batchedStore)(nil)

func (b *batchedStore) AdmitBatch(ctx context.Context, reqs []fencing.AdmitRequest, out []fencing.Admission, errs []error) {
	if b.hold != nil {
		<-b.hold
	}
	b.batches.Add(1)
	b.items.Add(int64(len(reqs)))
	for i := range reqs {
		out[i], errs[i] = b.Admit(ctx, reqs[i])
	}
}
