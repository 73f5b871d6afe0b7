package boltstore_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
)

// TestFileCutShortIsRefused: a store file cut short (a copy stopped
// halfway) used to stop the process at open, with a panic in bbolt's walk
// of its pages; it is refused with an error naming the file instead. A
// whole file, and one with bytes past its last page, still open.
func TestFileCutShortIsRefused(t *testing.T) {
	dir := t.TempDir()
	goodPath := filepath.Join(dir, "good.db")
	st, err := boltstore.Open(goodPath, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, st, "seed", "o")
	names := make([]string, 3000)
	for i := range names {
		names[i] = fmt.Sprintf("res:%06d", i)
	}
	if err := boltstore.CopyRecord(st, "seed", names); err != nil {
		t.Fatal(err)
	}
	closeStore(t, st)
	good, err := os.ReadFile(goodPath)
	if err != nil {
		t.Fatal(err)
	}
	marker, err := os.ReadFile(goodPath + ".lineage")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		bytes []byte
		opens bool
	}{
		"whole":                         {good, true},
		"longer":                        {append(append([]byte(nil), good...), make([]byte, 8192)...), true},
		"half":                          {good[:len(good)/2], false},
		"three pages":                   {good[:3*4096], false},
		"three pages, the first zeroed": {append(make([]byte, 4096), good[4096:3*4096]...), false},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fencegate.db")
			if err := os.WriteFile(path, c.bytes, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path+".lineage", marker, 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := boltstore.Open(path, boltstore.Options{})
			if c.opens {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				mustAcquire(t, st, "fresh", "p")
				closeStore(t, st)
				return
			}
			if err == nil {
				st.Close()
				t.Fatal("a file cut short opened")
			}
			if !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "cut short") {
				t.Fatalf("Open: %v, want ErrUnavailable naming %s as cut short", err, path)
			}
		})
	}
}
