package boltstore

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fencegate/fencegate/fencing"
)

// Loss of the store file: the lineage.
//
// The store file carries an identity (16 random bytes, made with the file)
// and a generation, bumped by every group commit (group.go) that issues a
// token or raises a high-water mark. A small marker file beside it,
// PATH.lineage, repeats the identity and generation, plus the highest token
// the file has issued. The marker is written after the commit it describes,
// with no flush of its own, so that a group costs one flush (the commit's);
// it is flushed in the background at most every markerFlushInterval, and
// on Close. So for a file that lost nothing, marker generation <= file
// generation: a crash at any moment (kill -9 between a commit and its
// marker write, or a power loss that drops the marker's unflushed writes)
// leaves the marker at or behind the file, never ahead, and is never taken
// for a loss.
//
// On Open the two are compared. The file is judged to have lost data when
// it is new but a marker names an earlier file (deleted, or replaced by a
// fresh one), when its identity differs from the marker's (replaced by
// another store file), when its generation is behind the marker's
// (restored from an older copy), or when the marker is missing or
// unreadable beside an existing file (restored or moved without it). The store then sets its floor to
// max(the highest token the marker records, the host clock in µs, the old
// floor) and lifts every record to it when it is next read
// (record.Record.Lift): the next token of every resource is above every
// token issued before the loss, every pre-loss token is refused, and live
// leases end.
//
// A brand-new file with no marker (a first start, or the loss of the file
// together with its marker, as when a container without a volume is
// recreated) starts at a floor taken from the host clock in µs: its first
// tokens are above every token a file created earlier on a host whose
// clock did not step back could have issued, because each acquisition is
// one commit of at most maxGroupCalls calls, each adding at most one to a
// resource's count, and a commit takes far longer than maxGroupCalls µs.
// Options.CountFromOne turns that floor off.
//
// Limits: losing the file and the marker together is covered only by the
// clock, so a host clock stepped back behind the lost file's tokens can
// repeat them. A copy of the file and its marker restored together is not
// detected. A copy taken less than markerFlushInterval before a power loss
// that dropped the marker's last writes, restored after it, is not
// detected: the marker on disk may be as old as the copy.
// Renewals, releases and checkpoints do not bump the generation:
// an older copy that differs from the lost file only by those is not
// detected (a released lease may look live again; a checkpoint may be
// older). A false alarm (a crash inside Open, between its marker write
// and its commit) costs only what a detected loss costs: tokens skip ahead
// and holders acquire again.

// markerSuffix names the marker file: PATH + markerSuffix.
const markerSuffix = ".lineage"

// Marker layout: magic, identity, generation, highest token, CRC32 (IEEE)
// of what precedes it. Fixed size, written in place at offset 0 in one
// write, far below a disk sector; a torn or foreign marker fails the CRC
// and is treated as unreadable.
const (
	markerMagic = "FGLINE01"
	markerSize  = 8 + 16 + 8 + 8 + 4
)

var (
	keyID    = []byte("id")
	keyGen   = []byte("gen")
	keyFloor = []byte("floor")
)

// lineage is a file's identity and generation, or a marker's (with max).
type lineage struct {
	id  [16]byte
	gen uint64
	max fencing.Token // markers only: the highest token issued
}

func (l lineage) encode() []byte {
	b := make([]byte, markerSize)
	copy(b, markerMagic)
	copy(b[8:], l.id[:])
	binary.BigEndian.PutUint64(b[24:], l.gen)
	binary.BigEndian.PutUint64(b[32:], uint64(l.max))
	binary.BigEndian.PutUint32(b[40:], crc32.ChecksumIEEE(b[:40]))
	return b
}

func decodeMarker(b []byte) (lineage, bool) {
	if len(b) != markerSize || string(b[:8]) != markerMagic || binary.BigEndian.Uint32(b[40:]) != crc32.ChecksumIEEE(b[:40]) {
		return lineage{}, false
	}
	var l lineage
	copy(l.id[:], b[8:24])
	l.gen = binary.BigEndian.Uint64(b[24:])
	l.max = fencing.Token(binary.BigEndian.Uint64(b[32:]))
	return l, true
}

// markerFlushInterval is how often, at most, the marker is flushed after
// commits moved it: a restore from a copy taken within about that long
// before a power loss may go undetected (see the limits above).
const markerFlushInterval = time.Second

// markerFile is the open marker. Its writes are serialized by the store:
// at Open, by the group commit's one leader at a time, and at Close.
type markerFile struct {
	f *os.File
	// opened is when the marker was opened; lastFlush is the time since
	// opened of the last flush; flushing is set while a background flush
	// runs, and flushes counts them for Close to wait on.
	opened    time.Time
	lastFlush atomic.Int64
	flushing  atomic.Bool
	flushes   sync.WaitGroup
}

// markerState is what Open found beside the store file.
type markerState int

const (
	markerAbsent markerState = iota
	markerOK
	markerUnreadable
)

// openMarker opens (creating) the marker at path, locks it (lockMarker,
// waiting up to timeout) and reads what it holds.
func openMarker(path string, timeout time.Duration) (*markerFile, lineage, markerState, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, lineage{}, 0, fmt.Errorf("open marker %s: %w", path, err)
	}
	if err := lockMarker(f, timeout); err != nil {
		f.Close()
		return nil, lineage{}, 0, fmt.Errorf("lineage marker %s is locked by another process (waited %v; is another fencegate still running on this store, its file deleted or replaced under it?): %w", path, timeout, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, markerSize+1))
	if err != nil {
		f.Close()
		return nil, lineage{}, 0, fmt.Errorf("read marker %s: %w", path, err)
	}
	m := &markerFile{f: f, opened: time.Now()}
	if len(b) == 0 {
		return m, lineage{}, markerAbsent, nil
	}
	l, ok := decodeMarker(b)
	if !ok {
		return m, lineage{}, markerUnreadable, nil
	}
	return m, l, markerOK, nil
}

// write replaces the marker's content and fsyncs it.
func (m *markerFile) write(l lineage) error {
	if _, err := m.f.WriteAt(l.encode(), 0); err != nil {
		return err
	}
	if err := m.f.Truncate(markerSize); err != nil {
		return err
	}
	return m.f.Sync()
}

// put replaces the marker's content without waiting for a flush: the
// commit it follows was the group's one flush. It starts a background flush
// when the last one is older than markerFlushInterval.
func (m *markerFile) put(l lineage) error {
	if _, err := m.f.WriteAt(l.encode(), 0); err != nil {
		return err
	}
	if time.Duration(time.Since(m.opened)-time.Duration(m.lastFlush.Load())) < markerFlushInterval || !m.flushing.CompareAndSwap(false, true) {
		return nil
	}
	m.flushes.Add(1)
	go func() {
		defer m.flushes.Done()
		defer m.flushing.Store(false)
		if m.f.Sync() == nil {
			m.lastFlush.Store(int64(time.Since(m.opened)))
		}
	}()
	return nil
}

// close waits for a background flush, then closes the file.
func (m *markerFile) close() error {
	m.flushes.Wait()
	return m.f.Close()
}

// syncDir fsyncs the directory holding path, so a newly created file's
// name survives a crash.
func syncDir(path string) error {
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return err
	}
	return nil
}

// fileLineage reads the file's identity, generation and floor from the meta
// bucket; hasID is false for a file written before lineages existed.
func fileLineage(meta *bolt.Bucket) (l lineage, floor fencing.Token, hasID bool) {
	if v := meta.Get(keyID); len(v) == len(l.id) {
		copy(l.id[:], v)
		hasID = true
	}
	if v := meta.Get(keyGen); len(v) == 8 {
		l.gen = binary.BigEndian.Uint64(v)
	}
	if v := meta.Get(keyFloor); len(v) == 8 {
		floor = fencing.Token(binary.BigEndian.Uint64(v))
	}
	return l, floor, hasID
}

func putUint64(b *bolt.Bucket, key []byte, v uint64) error {
	return b.Put(key, binary.BigEndian.AppendUint64(nil, v))
}

// lossReason compares a store file with its marker and says why the file is
// judged to have lost data, or "" when it is not.
func lossReason(fresh, hasID bool, file lineage, state markerState, mk lineage) string {
	switch {
	case fresh && state == markerAbsent:
		return ""
	case fresh:
		return "the store file is new but its lineage marker names an earlier store file (the file was deleted or replaced by a fresh one)"
	case !hasID:
		return "" // written before lineages existed: adopt it
	case state == markerAbsent:
		return "the lineage marker beside the store file is missing (the file was restored or moved without it)"
	case state == markerUnreadable:
		return "the lineage marker beside the store file is unreadable"
	case !bytes.Equal(mk.id[:], file.id[:]):
		return "the store file is not the one its lineage marker names (the file was replaced)"
	case mk.gen > file.gen:
		return fmt.Sprintf("the store file is at generation %d, its lineage marker at %d (the file was restored from an older copy)", file.gen, mk.gen)
	}
	return ""
}

func newID() ([16]byte, error) {
	var id [16]byte
	_, err := rand.Read(id[:])
	return id, err
}

// checkLineage compares the file with its marker (see lineage.go), sets the
// store's floor, and writes the new generation to the marker and then to
// the file, in tx.
func (s *Store) checkLineage(meta *bolt.Bucket, fresh bool, state markerState, mk lineage, countFromOne bool) error {
	file, floor, hasID := fileLineage(meta)
	clockFloor := fencing.Token(max(s.clock.Now().UnixMicro(), 0))
	s.lossDetected = lossReason(fresh, hasID, file, state, mk)
	switch {
	case s.lossDetected != "":
		floor = max(floor, clockFloor, mk.max)
	case fresh && !countFromOne:
		floor = clockFloor
	}
	id := file.id
	if fresh || !hasID || s.lossDetected != "" {
		var err error
		if id, err = newID(); err != nil {
			return err
		}
	}
	next := lineage{id: id, gen: max(file.gen, mk.gen) + 1, max: max(floor, mk.max)}
	if state == markerOK && mk.id != id {
		next.max = floor // another lineage's tokens are below floor already
	}
	if err := s.marker.write(next); err != nil {
		return fmt.Errorf("write lineage marker: %w", err)
	}
	s.lineage, s.floor = next, floor
	if err := meta.Put(keyID, id[:]); err != nil {
		return err
	}
	if err := putUint64(meta, keyGen, next.gen); err != nil {
		return err
	}
	return putUint64(meta, keyFloor, uint64(floor))
}

// LossDetected reports why Open judged the store file to have lost data
// (deleted, replaced, restored from an older copy), or "" when it did not.
// After a loss every resource has moved past the tokens issued before it.
func (s *Store) LossDetected() string { return s.lossDetected }

// nextLineage records in tx, before it commits, that it issues tokens or
// raises marks up to top: the file's generation moves on. The caller makes
// the result the store's lineage and puts it in the marker once tx has
// committed (see committed).
func (s *Store) nextLineage(tx *bolt.Tx, top fencing.Token) (lineage, error) {
	next := s.lineage
	next.gen++
	next.max = max(next.max, top)
	return next, putUint64(tx.Bucket(bucketMeta), keyGen, next.gen)
}

// committed makes next, whose commit has returned, the store's lineage and
// writes it into the marker, without a flush of its own (see lineage.go).
// A marker write that fails leaves the marker behind the file, which is
// safe (it is never taken for a loss); Close writes it again.
func (s *Store) committed(next lineage) {
	s.markerMu.Lock()
	defer s.markerMu.Unlock()
	s.lineage = next
	if !s.markerClosed {
		_ = s.marker.put(next)
	}
}
