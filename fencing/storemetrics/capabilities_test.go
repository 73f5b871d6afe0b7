package storemetrics_test

import (
	"path/filepath"
	"testing"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/pgstore"
	"github.com/fencegate/fencegate/fencing/storemetrics"
	"github.com/fencegate/fencegate/fencing/valkeystore"
)

// has names the capabilities a fencing.Capabilities holds.
func has(c fencing.Capabilities) map[string]bool {
	return map[string]bool{
		"quick": c.Quick != nil, "batch": c.Batch != nil, "marks": c.Marks != nil,
		"retain": c.Retain != nil, "holds": c.Holds != nil, "shared": c.Shared != nil,
		"keep": c.Keep != nil,
	}
}

// TestCapabilitiesThroughTheDecorator: fencing.CapabilitiesOf reports
// exactly what each store has, the same for the store itself, the store
// seen through the decorator, and through two decorators; the admitting
// capabilities come back measured (not the store's own), the others as
// the store's own. The stores are never called: a capability is a
// property of the store's type, so typed nil stores serve, except the file
// store, whose commits the decorator observes from the start (an open one).
func TestCapabilitiesThroughTheDecorator(t *testing.T) {
	file, err := boltstore.Open(filepath.Join(t.TempDir(), "caps.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { file.Close() })
	for _, tc := range []struct {
		name  string
		store fencing.Store
		want  []string
	}{
		{"memory", (*memstore.Store)(nil), []string{"quick", "retain", "holds", "keep"}},
		{"file", file, []string{"quick", "retain", "holds", "keep"}},
		{"valkey", (*valkeystore.Store)(nil), []string{"batch", "marks", "shared"}},
		{"postgres", (*pgstore.Store)(nil), []string{"retain", "shared"}},
		{"none", struct{ fencing.Store }{(*memstore.Store)(nil)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := has(fencing.Capabilities{})
			for _, c := range tc.want {
				want[c] = true
			}
			own := fencing.CapabilitiesOf(tc.store)
			once := fencing.CapabilitiesOf(storemetrics.Wrap(tc.store, nil, nil))
			twice := fencing.CapabilitiesOf(storemetrics.Wrap(storemetrics.Wrap(tc.store, nil, nil), nil, nil))
			for name, c := range map[string]fencing.Capabilities{"the store": own, "one decorator": once, "two decorators": twice} {
				got := has(c)
				for k := range want {
					if got[k] != want[k] {
						t.Errorf("through %s: %s = %v, want %v", name, k, got[k], want[k])
					}
				}
			}
			if once.Quick != nil && once.Quick == own.Quick {
				t.Error("the decorator reports the store's own QuickAdmitter: its admissions are not measured")
			}
			if once.Batch != nil && once.Batch == own.Batch {
				t.Error("the decorator reports the store's own BatchAdmitter: its admissions are not measured")
			}
			if once.Marks != nil && once.Marks == own.Marks {
				t.Error("the decorator reports the store's own MarkReaders: their admissions are not measured")
			}
			if once.Shared != own.Shared || once.Holds != own.Holds || once.Retain != own.Retain {
				t.Error("the decorator changed the store's shared barrier, holds or retention")
			}
		})
	}
}
