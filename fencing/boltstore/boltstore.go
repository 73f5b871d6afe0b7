// Package boltstore is the durable embedded fencing.Store behind
// FENCEGATE_STORE=file:PATH, built on bbolt (a single-file B+tree with
// copy-on-write transactions).
//
// Durability: every mutation runs in a bbolt read-write transaction, shared
// with the mutations that arrived at the same time (group commit, see
// group.go), and bbolt fsyncs (fdatasync) on commit before any of them is
// answered, so when a call that issued a token or raised a high-water mark
// returns, the new counter is on disk. A crash or power
// loss afterwards cannot make a token be issued twice or let an older token
// pass the mark again.
//
// Layout: bucket "records" maps a resource name to its record.Record as
// JSON (tokens, marks, last lease, history, checkpoint metadata); bucket
// "states" maps it to the raw checkpoint state, kept apart so renewals and
// admissions never rewrite a large state. Lease expiry is kept as a
// wall-clock instant (Unix milliseconds): a live lease stays live across a
// restart, and one that expired while fencegate was down is expired when it
// comes back.
//
// Loss of the file (deleted, replaced, restored from an older copy) is
// detected on Open by comparing the file with a lineage marker kept beside
// it (PATH.lineage); after a detected loss every resource moves past every
// token issued before it. A new file's tokens start at the host clock in
// µs. See lineage.go for the design and its limits.
//
// Tokens follow the clock (DESIGN §12): a new lease gets max(issued+1, the
// token clock), the token clock being the host clock in µs, never below
// the highest token the file has issued plus one and never running
// backwards while the store is open (a reading behind the latest used is
// counted in RetentionStats.ClockBehind; a file whose tokens are ahead of
// the host clock by more than a second at Open is logged). A fresh
// record's floor starts just below its first token, so a token issued
// before the record existed, was removed by retention or was restored
// away is refused as stale. Options.CountFromOne counts from one instead.
//
// Retention: with Options.Retention, a background sweep removes records
// with no live lease untouched for the retention, keeping those with a
// write in flight through the gate (KeepInFlight). It finds them in read
// transactions of Options.SweepBatch records and removes them in calls of
// at most 256 records that ride in the group commits of the writes (see
// sweep.go), re-checking each record there; admissions at the mark read
// the mark cache and are never held by it.
//
// Limits: one process at a time. bbolt takes an exclusive file lock; a
// second opener fails after Options.Timeout with an error naming the file.
// Writes are committed in groups (group.go): concurrent writers share one
// transaction and one flush, each answered after the flush. Admissions at
// the current mark only read and run concurrently, answered from an
// in-memory copy of each resource's last committed record (see marks.go)
// without a transaction or an allocation. Opening reads the whole tree to
// find its free pages (they are not written on each commit): about half a
// second per million records with the file in the page cache. The file
// must be on a local file system that honours fsync and flock.
package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
	"github.com/fencegate/fencegate/fencing/retention"
)

var (
	bucketRecords = []byte("records")
	bucketStates  = []byte("states")
	bucketMeta    = []byte("meta")
	keyFormat     = []byte("format")
	// keySwept is the highest token of a record retention removed, for a
	// file counting from one: fresh records start above it.
	keySwept = []byte("swept")
)

// formatVersion is written into a new file and checked on open, so a file
// written by an incompatible future layout is refused instead of misread.
const formatVersion = "1"

// DefaultTimeout is how long Open waits for the file lock by default.
const DefaultTimeout = time.Second

// Options configure a Store.
type Options struct {
	// Clock judges expiry and stamps leases and checkpoints; nil means
	// fencing.SystemClock. Times are persisted as wall-clock instants.
	Clock fencing.Clock
	// MaxCheckpointBytes limits checkpoint state; 0 means
	// fencing.DefaultMaxCheckpointBytes.
	MaxCheckpointBytes int
	// Timeout is how long Open waits for the exclusive file lock held by
	// another process; 0 means DefaultTimeout. Negative is invalid.
	Timeout time.Duration
	// CountFromOne makes a new file (with no lineage marker beside it)
	// issue token 1 first instead of starting at the host clock's floor
	// (see lineage.go). For tests and demos that want small tokens: such a
	// file does not protect against the loss of itself together with its
	// marker. A detected loss sets a floor regardless.
	CountFromOne bool
	// Logger receives the warning Open logs when it detects a loss of the
	// store's data; nil discards it.
	Logger *slog.Logger
	// Retention removes a record with no live lease untouched for this
	// long (FENCEGATE_RETENTION); 0 keeps every record. A background sweep
	// runs every SweepInterval (0: retention.Interval(Retention)) until
	// Close; Sweep runs one pass now.
	Retention     time.Duration
	SweepInterval time.Duration
	// SweepBatch is how many records a sweep examines per read
	// transaction; 0 means retention.DefaultBatch. It removes the idle
	// ones in group-committed calls of at most 256 records (sweep.go).
	SweepBatch int
}

// Store is the file-backed fencing.Store. Safe for concurrent use within
// one process; only one process may have the file open.
type Store struct {
	db       *bolt.DB
	path     string
	clock    fencing.Clock
	maxState int

	// floor lifts every record read (record.Record.Lift); set by Open,
	// read-only after.
	floor fencing.Token
	// lossDetected is the reason Open judged the file to have lost data,
	// "" if it did not.
	lossDetected string
	// marker and lineage (the identity, the generation of the last
	// commit that moved it, the highest token issued) change at Open and
	// after each group's commit, one group commit leader at a time.
	marker  *markerFile
	lineage lineage
	// markerMu orders the marker's last writes: a group's after its
	// commit, and Close's, which closes it (markerClosed).
	markerMu     sync.Mutex
	markerClosed bool

	// marks answers admissions at the mark without a transaction.
	marks marks

	// tokens is the token clock; nil when counting from one.
	tokens *retention.Clock
	// swept is the highest token of a record retention removed (keySwept):
	// changed in write transactions, read in them and in admissions.
	swept     atomic.Uint64
	retention time.Duration
	batch     int
	stats     retention.Stats
	sweeper   *retention.Loop
	// sweepMu runs one sweep pass at a time.
	sweepMu sync.Mutex
	// inFlight reports the resources with writes in flight through the
	// gate (KeepInFlight): the sweep keeps their records. Nil: none.
	inFlight atomic.Pointer[func(resource string) bool]
	// removing holds the resources of the sweep call running now, from
	// before it asks inFlight until its commit has returned; nil between
	// calls. An admission for one of them is decided in the group commit,
	// after the call (see Admit).
	removing atomic.Pointer[map[string]struct{}]
	// closed is set by Close, before the database closes: admissions then
	// read the file, which answers that it is closed.
	closed atomic.Bool
	// failed is set, once, by a commit that failed (see fail): from then
	// on every operation answers it.
	failed atomic.Pointer[error]
	log    *slog.Logger // nil: discard

	// group queues writes and commits them in groups (group.go).
	group committer
	// hooks are set by tests only (export_test.go).
	hooks hooks
}

// hooks let the package's tests see and steer group commits; all nil in
// production.
type hooks struct {
	// afterSave runs after each call saved its record; an error fails
	// that call as a storage failure would.
	afterSave func(resource string) error
	// beforeCommit runs before a group's transaction commits, with the
	// number of calls in the group.
	beforeCommit func(calls int)
	// sweepScanned runs after each scan of a sweep, before its removals,
	// with the keys it found idle.
	sweepScanned func(idle [][]byte)
}

var (
	_ fencing.Store    = (*Store)(nil)
	_ fencing.Retainer = (*Store)(nil)
)

// Open opens (creating if needed, mode 0600) the store file at path. It
// fails with an error naming path when another process holds the file
// after opts.Timeout, or when the file is not a fencegate store. Errors
// from Open match fencing.ErrUnavailable.
func Open(path string, opts Options) (*Store, error) {
	if opts.Clock == nil {
		opts.Clock = fencing.SystemClock{}
	}
	if opts.MaxCheckpointBytes == 0 {
		opts.MaxCheckpointBytes = fencing.DefaultMaxCheckpointBytes
	}
	if opts.MaxCheckpointBytes < 0 {
		return nil, fmt.Errorf("boltstore: MaxCheckpointBytes %d is negative", opts.MaxCheckpointBytes)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("boltstore: Timeout %v is negative", opts.Timeout)
	}
	if err := checkLength(path); err != nil {
		return nil, fmt.Errorf("%w: store file %s: %w", fencing.ErrUnavailable, path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: opts.Timeout,
		// The list of free pages is not written on each commit but rebuilt
		// from the tree when the file is opened, as etcd does: after the
		// retention sweep removed many records, a written list holds every
		// page they freed and made each later commit write all of it
		// (hundreds of KiB per commit for a few hundred thousand records
		// removed), while opening a file of a million records scans it in
		// about half a second. A file written either way opens either way.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: store file %s is locked by another process (waited %v; is another fencegate running on it?): %w", fencing.ErrUnavailable, path, opts.Timeout, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: open store file %s: %w", fencing.ErrUnavailable, path, err)
	}
	// The marker is opened under bbolt's file lock and a lock of its own,
	// so it has one writer, even beside a fencegate whose file was deleted.
	marker, mk, state, err := openMarker(path+markerSuffix, opts.Timeout)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("%w: store file %s: %w", fencing.ErrUnavailable, path, err)
	}
	if opts.SweepBatch <= 0 {
		opts.SweepBatch = retention.DefaultBatch
	}
	s := &Store{db: db, path: path, clock: opts.Clock, maxState: opts.MaxCheckpointBytes, marker: marker,
		retention: max(opts.Retention, 0), batch: opts.SweepBatch, log: opts.Logger}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		fresh := false
		switch v := meta.Get(keyFormat); {
		case v == nil:
			fresh = true
			if err := meta.Put(keyFormat, []byte(formatVersion)); err != nil {
				return err
			}
		case string(v) != formatVersion:
			return fmt.Errorf("format version %q, this fencegate reads %q", v, formatVersion)
		}
		for _, name := range [][]byte{bucketRecords, bucketStates} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if v := meta.Get(keySwept); len(v) == 8 {
			s.swept.Store(binary.BigEndian.Uint64(v))
		}
		return s.checkLineage(meta, fresh, state, mk, opts.CountFromOne)
	})
	if err != nil {
		db.Close()
		marker.close()
		return nil, fmt.Errorf("%w: initialize store file %s: %w", fencing.ErrUnavailable, path, err)
	}
	if state == markerAbsent {
		if err := syncDir(path); err != nil {
			s.Close()
			return nil, fmt.Errorf("%w: store file %s: sync directory: %w", fencing.ErrUnavailable, path, err)
		}
	}
	if !opts.CountFromOne {
		s.tokens = retention.NewClock(&s.stats)
		// Above every token the file has issued, whatever the clock says.
		s.tokens.Raise(s.lineage.max + 1)
		if now := record.ClockMicros(s.clock.Now()); s.lineage.max > now+fencing.Token(time.Second/time.Microsecond) && opts.Logger != nil {
			opts.Logger.Warn("boltstore: the host clock is behind the tokens this store file issued; new resources start above them, not at the clock",
				"path", path, "clock_us", now, "highest_token", s.lineage.max)
		}
	}
	if s.retention > 0 {
		every := opts.SweepInterval
		if every <= 0 {
			every = retention.Interval(s.retention)
		}
		s.sweeper = retention.Start(every, s.sweep, &s.stats, opts.Logger)
	}
	if s.lossDetected != "" && opts.Logger != nil {
		opts.Logger.Warn("boltstore: the store file lost data; every resource moves past the tokens issued before the loss: "+
			"holders of earlier tokens must acquire again, and their writes are refused",
			"path", path, "reason", s.lossDetected, "floor", s.floor)
	}
	return s, nil
}

// Path is the store file's path.
func (s *Store) Path() string { return s.path }

// Ping implements fencing.Store: it fails once the store is closed, or
// once a commit failed (see fail).
func (s *Store) Ping(ctx context.Context) error {
	return s.view(ctx, func(*bolt.Tx) error { return nil })
}

// Close implements fencing.Store. It stops the retention sweep, waits for
// running transactions, then releases the file lock. Calling it again is
// harmless.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.sweeper.Stop()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("boltstore: close %s: %w", s.path, err)
	}
	// After the database: no transaction can write the marker any more
	// (a group that committed just before may still put its lineage: it
	// holds markerMu meanwhile). The last lineage, flushed: a clean stop
	// leaves the marker exact.
	s.markerMu.Lock()
	defer s.markerMu.Unlock()
	if s.markerClosed {
		return nil
	}
	s.markerClosed = true
	err := s.marker.write(s.lineage)
	if cerr := s.marker.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("boltstore: close %s: %w", s.path+markerSuffix, err)
	}
	return nil
}
