package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
)

// A file cut short (copied or restored halfway, a full disk during a copy)
// is refused before bbolt opens it: bbolt walks the whole tree at open to
// rebuild its list of free pages (NoFreelistSync), and a page beyond the
// end of the file, or one that does not name itself, makes that walk panic
// in a goroutine of bbolt's own, which nothing can recover: the process
// would stop with a stack trace instead of an error naming the file.
// checkLength reads the two meta pages and refuses a file shorter than
// the pages its newest valid meta page counts. Damage inside a file of
// the right length is not found here (bbolt may still stop the process on
// it); a file with no valid meta page is left to bbolt, which refuses it.

// boltMeta is the part of a bbolt meta page (bbolt v1.5's common.Meta,
// after the 16-byte page header) checkLength reads.
type boltMeta struct {
	pageSize uint32
	pgid     uint64 // the high-water mark: pages [0, pgid) are in use
	txid     uint64
}

const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	boltPageHeader = 16
	boltMetaSize   = 64 // up to and with the checksum
)

// checkLength returns nil for a missing or empty file, for a file whose
// length covers its newest valid meta page's high-water mark, and for a
// file with no valid meta page (bbolt refuses it); an error otherwise.
func checkLength(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || info.Size() == 0 {
		return err
	}
	newest, ok := readMeta(f, 0)
	if ok {
		if other, ok1 := readMeta(f, int64(newest.pageSize)); ok1 && other.txid > newest.txid {
			newest = other
		}
	} else {
		// Page 0 is unreadable: page 1 sits one page further, at a
		// page size bbolt could have used; try them as bbolt does.
		for size := int64(1024); size <= 1<<24; size <<= 1 {
			if newest, ok = readMeta(f, size); ok && int64(newest.pageSize) == size {
				break
			}
			ok = false
		}
		if !ok {
			return nil
		}
	}
	if need := int64(newest.pgid) * int64(newest.pageSize); info.Size() < need {
		return fmt.Errorf("the file is cut short: %d bytes, where its last commit counts %d (truncated or partly copied; restore it from a backup, or move it away to start a new one)", info.Size(), need)
	}
	return nil
}

// readMeta reads the meta page at off and reports whether it is a valid
// one (magic, version and checksum as bbolt checks them).
func readMeta(f *os.File, off int64) (boltMeta, bool) {
	var b [boltPageHeader + boltMetaSize]byte
	if _, err := f.ReadAt(b[:], off); err != nil && !errors.Is(err, io.EOF) {
		return boltMeta{}, false
	}
	m := b[boltPageHeader:]
	le := binary.NativeEndian // bbolt writes its structures in the machine's order
	h := fnv.New64a()
	h.Write(m[:56])
	if le.Uint32(m[0:]) != boltMagic || le.Uint32(m[4:]) != boltVersion || le.Uint64(m[56:]) != h.Sum64() {
		return boltMeta{}, false
	}
	return boltMeta{pageSize: le.Uint32(m[8:]), pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}, true
}
