package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/record"
)

// The shared barrier (fencing.SharedBarrier) in PostgreSQL.
//
// Entries are rows of the barrier table (resource, token, id, gate,
// deadline), the deadline being the database's clock_timestamp() plus the
// hold. AdmitRegister admits and registers in one batch of statements sent
// together (one round trip, one implicit transaction, each statement with
// its own snapshot under READ COMMITTED), most often one batch per write:
//
//	[updateIf]  only to raise the mark: the decision taken on the record
//	            read by the previous batch, written if the row has not
//	            changed since, under the row's exclusive lock
//	readShared  the record, under the row's shared lock (admissions at
//	            the mark do not wait for each other)
//	register    the entry, only if the record's mark is the token (the
//	            write is admitted at the mark; under a strict rule, only
//	            if the token's lease is live), and the lower entries; the
//	            client decides on the record read at this statement's
//	            clock, so a write it refuses registered nothing
//
// A raise thus waits for every admission in flight at the old mark to
// commit its entry, and reads the entries only after that, in a later
// statement (a new snapshot): a lower entry admitted before the raise is
// always seen, and one after it is refused (its register finds the mark
// above its token). A write whose first batch finds the mark below its
// token sends a second one with the raise; after attempts batches that
// each found the record changed, it decides in a transaction holding the
// exclusive lock. All of this needs READ COMMITTED (each statement sees
// what committed before it began), which Open sets for the session.
//
// Leave deletes the entry and, in the same statement, announces it with
// pg_notify on the channel barrierChannel, the payload naming the schema
// and the resource. Every gate LISTENs on one dedicated connection per
// Store and wakes the writes waiting on that resource. Notifications are
// delivered at most once (a listener that reconnects misses those sent
// meanwhile), so waiting writes also check again at the earliest deadline
// of the entries they wait for and at least every barrierRecheck.

// barrierChannel is the channel Leave notifies and WaitLower listens on,
// for every schema: the payload is "<schema> <resource>" (neither contains
// a space).
const barrierChannel = "fencegate_barrier"

// barrierRecheck bounds the time between two checks of a waiting write
// when no notification arrives (a variable for tests).
var barrierRecheck = 250 * time.Millisecond

// barrierStatements are the barrier's SQL for table b:
//
//	register  $1 resource, $2 token, $3 gate, $4 hold ms, $5 whether the
//	          lease must be live: inserts the entry when the resource's
//	          mark is the token and above its floor and, with $5, the
//	          token's lease is live at the statement's clock (exactly when
//	          the write is admitted at the mark: record.Record.Admit, whose
//	          millisecond expiry compares alike), deletes the expired lower
//	          ones; returns the entry's id (NULL: none inserted), the
//	          statement's clock in Unix µs (the caller decides at it, so
//	          its decision and the insert agree) and check's columns.
//	check     $1 resource, $2 token, $3 the waiting write's own entry id:
//	          deletes the expired entries below the token; returns how many,
//	          how many unexpired ones remain, the milliseconds until the
//	          earliest of their deadlines, and whether the own entry is
//	          still there (gone: the table lost rows, and the entries of the
//	          writes it waited for may have gone with them).
//	leave     $1 resource, $2 id, $3 payload: deletes the entry and
//	          notifies when there was one, without waiting for the
//	          commit's flush.
//
// One clock reading per statement, so an entry is either expired (and
// deleted) or counted.
func barrierStatements(b, resources string) (register, check, leave string) {
	// Expired entries another statement is deleting are skipped, not
	// waited for: no lock waits, no deadlocks between cleanups.
	lower := `del AS (DELETE FROM ` + b + ` WHERE id IN (SELECT id FROM ` + b + `
			WHERE resource = $1 AND token < $2 AND deadline <= (SELECT t FROM now) FOR UPDATE SKIP LOCKED) RETURNING 1)`
	counts := `(SELECT pg_catalog.count(*) FROM del)::int, pg_catalog.count(*)::int,
		coalesce(pg_catalog.ceil(extract(epoch FROM pg_catalog.min(deadline) - (SELECT t FROM now)) * 1000), 0)::bigint
		FROM ` + b + ` WHERE resource = $1 AND token < $2 AND deadline > (SELECT t FROM now)`
	register = `WITH now AS (SELECT pg_catalog.clock_timestamp() AS t),
		ins AS (INSERT INTO ` + b + ` (resource, token, gate, deadline)
			SELECT $1::text, $2::bigint, $3::text, t + $4::bigint * interval '1 millisecond' FROM now
			WHERE EXISTS (SELECT 1 FROM ` + resources + ` WHERE resource = $1 AND high_water = $2 AND floor < $2
				AND (NOT $5::boolean OR (owner IS NOT NULL AND NOT released AND token = $2 AND expires_at > (SELECT t FROM now))))
			RETURNING id),
		` + lower + `
		SELECT (SELECT id FROM ins), pg_catalog.floor(extract(epoch FROM (SELECT t FROM now)) * 1000000)::bigint, ` + counts
	check = `WITH now AS (SELECT pg_catalog.clock_timestamp() AS t), ` + lower + ` SELECT ` + strings.Replace(counts, "FROM "+b+" WHERE", `,
		EXISTS (SELECT 1 FROM `+b+` WHERE resource = $1 AND id = $3::bigint)
		FROM `+b+` WHERE`, 1)
	// A removal need not be durable: one lost to a crash of the database
	// leaves the entry until its deadline, which delays writes and never
	// reorders them. So it does not wait for the commit's flush.
	leave = `WITH d AS (DELETE FROM ` + b + ` WHERE resource = $1 AND id = $2 RETURNING 1)
		SELECT pg_catalog.pg_notify('` + barrierChannel + `', $3::text), pg_catalog.set_config('synchronous_commit', 'off', true) FROM d`
	return register, check, leave
}

// AdmitRegister implements fencing.SharedBarrier: Admit's decision and the
// registration in one batch, or two when the write raises the mark (see
// the top of this file). Unlike Admit it always writes (the entry), so
// every admission waits for its commit. Faults are classified as Admit's:
// a batch sent without a reply is fencing.ErrAmbiguous, and its entry may
// then exist until its deadline.
func (s *Store) AdmitRegister(ctx context.Context, req fencing.AdmitRequest, gate string, hold time.Duration) (fencing.Admission, fencing.BarrierEntry, bool, error) {
	var none fencing.BarrierEntry
	if err := req.Validate(); err != nil {
		return fencing.Admission{}, none, false, err
	}
	if hold < time.Millisecond {
		return fencing.Admission{}, none, false, errors.New("pgstore: shared barrier hold must be at least 1ms")
	}
	if gate == "" || strings.ContainsRune(gate, ':') {
		return fencing.Admission{}, none, false, fmt.Errorf("pgstore: gate id %q: want a non-empty name without ':'", gate)
	}
	bctx, cancel, err := s.begin(ctx, "admit")
	defer cancel()
	if err != nil {
		return fencing.Admission{}, none, false, err
	}
	var (
		raise   []any // updateIf's arguments: the decision on the record last read
		expired int
	)
	for try := 1; try <= attempts; try++ {
		b, err := s.admitBatch(bctx, req, gate, hold, raise)
		if err != nil {
			if retryBatch(err) && try < attempts && bctx.Err() == nil {
				continue
			}
			return fencing.Admission{}, none, false, classify("admit", err, batchSent(err))
		}
		expired += b.expired
		if b.row.syncOff {
			// The session's synchronous_commit is off: the raise was not
			// written (updateIf checks it), and an entry registered might
			// not survive a crash of the database. Refused, its entry gone
			// (or left to its deadline if that fails): nothing forwarded.
			if b.id != nil {
				_ = s.Leave(context.WithoutCancel(ctx), fencing.BarrierEntry{Resource: req.Resource, ID: gate + ":" + strconv.FormatInt(*b.id, 10)})
			}
			return fencing.Admission{}, none, false, syncOffErr("admit")
		}
		r := b.row.record()
		before := args(req.Resource, r)
		// Decided at the registration's clock, as the registration
		// decided, on the record it saw (the row is locked in between).
		a, changed, err := s.admitRecord(r, req, time.UnixMicro(b.nowUs).UTC())
		if b.id == nil {
			if err != nil {
				return fencing.Admission{}, none, false, err
			}
			// Admitted by raising the mark (or the record changed since
			// the raise was decided): the next batch raises it.
			raise = append(args(req.Resource, r), before[1:]...)
			continue
		}
		e := fencing.BarrierEntry{Resource: req.Resource, Token: req.Token, ID: gate + ":" + strconv.FormatInt(*b.id, 10), Expired: expired}
		if err != nil {
			// Refused although registered: the registration's condition
			// and the decision disagree, which they must not. The entry
			// goes, even when the caller has given up (if that fails too,
			// it stays until its deadline).
			_ = s.Leave(context.WithoutCancel(ctx), e)
			return fencing.Admission{}, none, false, err
		}
		if changed {
			// Admitted at the mark, with the record's touch stale for the
			// retention: touch it, as Admit would. The admission stands
			// whatever the touch finds now.
			_, _ = write(ctx, s, "admit", req.Resource, func(r *record.Record, now time.Time) (struct{}, bool, error) {
				_, changed, err := s.admitRecord(r, req, now)
				return struct{}{}, changed, err
			}, nil)
		}
		a.Raised = a.Raised || b.raised
		return a, e, b.lower > 0, nil
	}
	// The record kept changing between two batches: decide under the
	// row's exclusive lock, in a transaction.
	type registered struct {
		adm          fencing.Admission
		id           *int64
		lower, extra int
	}
	v, err := transact(ctx, s, "admit", req.Resource, s.sql.readLocked, func(r *record.Record, now time.Time) (registered, bool, error) {
		a, changed, err := s.admitRecord(r, req, now)
		return registered{adm: a}, changed, err
	}, nil, func(ctx context.Context, tx pgx.Tx, v registered) (registered, error) {
		// Decided under the exclusive lock: the registration need not
		// check the lease again.
		err := tx.QueryRow(ctx, s.sql.register, req.Resource, int64(req.Token), gate, hold.Milliseconds(), false).
			Scan(&v.id, new(int64), &v.extra, &v.lower, new(int64))
		if err == nil && v.id == nil {
			err = fmt.Errorf("pgstore: admit: the entry of an admitted write was not registered")
		}
		return v, err
	})
	if err != nil {
		return fencing.Admission{}, none, false, err
	}
	e := fencing.BarrierEntry{Resource: req.Resource, Token: req.Token, ID: gate + ":" + strconv.FormatInt(*v.id, 10), Expired: expired + v.extra}
	return v.adm, e, v.lower > 0, nil
}

// batchResult is what one of AdmitRegister's batches read.
type batchResult struct {
	row     *row
	raised  bool   // updateIf wrote the raise
	id      *int64 // the entry registered, or nil
	nowUs   int64  // the registration's clock, Unix µs
	lower   int
	expired int
}

// admitBatch sends one of AdmitRegister's batches (see the top of this
// file): updateIf with raise when raise is not nil, then readShared and
// register.
func (s *Store) admitBatch(ctx context.Context, req fencing.AdmitRequest, gate string, hold time.Duration, raise []any) (batchResult, error) {
	var b pgx.Batch
	if raise != nil {
		b.Queue(s.sql.updateIf, raise...)
	}
	b.Queue(s.sql.readShared, req.Resource)
	b.Queue(s.sql.register, req.Resource, int64(req.Token), gate, hold.Milliseconds(), req.RequireLive)
	br := s.pool.SendBatch(ctx, &b)
	var v batchResult
	err := func() error {
		if raise != nil {
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			v.raised = tag.RowsAffected() == 1
		}
		var err error
		if v.row, err = scanRow(br.QueryRow()); err != nil {
			return err
		}
		return br.QueryRow().Scan(&v.id, &v.nowUs, &v.expired, &v.lower, new(int64))
	}()
	return v, errors.Join(err, br.Close())
}

// batchSent reports whether a batch that failed with err may have been
// sent, and so committed: not when the connection could not be made or
// nothing was written.
func batchSent(err error) bool {
	var connectErr *pgconn.ConnectError
	return !errors.As(err, &connectErr) && !pgconn.SafeToRetry(err)
}

// retryBatch reports a batch's failure that certainly committed nothing
// and is worth another try: nothing was sent, the server closed the
// connection before reading the batch (restart, administrator), or it
// rolled the batch back asking for a retry (serialization failure,
// deadlock).
func retryBatch(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return connectionLost(err) || retryableRead(err)
	}
	return pgconn.SafeToRetry(err)
}

// entryID is the table's id of an entry named "<gate>:<id>".
func entryID(e fencing.BarrierEntry) (int64, error) {
	i := strings.LastIndexByte(e.ID, ':')
	id, err := strconv.ParseInt(e.ID[i+1:], 10, 64)
	if i < 0 || err != nil {
		return 0, fmt.Errorf("pgstore: %q is not a barrier entry of this store", e.ID)
	}
	return id, nil
}

// Leave implements fencing.SharedBarrier: one statement deletes the entry
// and notifies the waiting gates. It is tried again after a lost
// connection (leaving twice is harmless).
func (s *Store) Leave(ctx context.Context, e fencing.BarrierEntry) error {
	id, err := entryID(e)
	if err != nil {
		return err
	}
	return s.repeatable(ctx, "barrier leave", func(ctx context.Context) error {
		_, err := s.pool.Exec(ctx, s.sql.leave, e.Resource, id, s.schema+" "+e.Resource)
		return err
	})
}

// repeatable runs f, bounded by the statement timeout, trying again (at
// most attempts times in all) after a lost connection or a serialization
// failure: for statements that may be repeated (reads, the barrier's).
func (s *Store) repeatable(ctx context.Context, op string, f func(context.Context) error) error {
	ctx, cancel, err := s.begin(ctx, op)
	defer cancel()
	if err != nil {
		return err
	}
	for try := 1; ; try++ {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if !(connectionLost(err) || retryableRead(err)) || try == attempts || ctx.Err() != nil {
			return classify(op, err, false)
		}
	}
}

// WaitLower implements fencing.SharedBarrier: register with the store's
// listener, then check, then sleep until a notification for the resource,
// the earliest deadline of the lower entries or barrierRecheck, whichever
// comes first. Registering before the check means a Leave between the check
// and the sleep is not missed. A listener that fails fails the wait closed.
func (s *Store) WaitLower(ctx context.Context, e fencing.BarrierEntry) (int, error) {
	if s.closed.Load() {
		return 0, fmt.Errorf("%w: barrier wait: the postgres store is closed", fencing.ErrUnavailable)
	}
	id, err := entryID(e)
	if err != nil {
		return 0, err
	}
	w, err := s.listen.join(ctx, s, e.Resource)
	if err != nil {
		return 0, err
	}
	defer s.listen.leave(w)
	return fencing.WaitLowerLoop(ctx, barrierRecheck, func() <-chan struct{} { return s.listen.wakeChan(w) },
		w.gen.done, func() error { return w.gen.err }, func(ctx context.Context) (fencing.BarrierCheck, error) {
			var c fencing.BarrierCheck
			var waitMs int64
			var own bool
			err := s.repeatable(ctx, "barrier check", func(ctx context.Context) error {
				return s.pool.QueryRow(ctx, s.sql.check, e.Resource, int64(e.Token), id).Scan(&c.Expired, &c.Lower, &waitMs, &own)
			})
			if err == nil && !own {
				return fencing.BarrierCheck{}, fmt.Errorf("%w: barrier wait: this write's entry in the shared barrier is gone from the database, "+
					"which lost rows (the entries of the writes it waited for may have gone with them): not forwarded", fencing.ErrUnavailable)
			}
			c.Wait = time.Duration(waitMs) * time.Millisecond
			return c, err
		})
}

// listener is a Store's one LISTEN connection and the writes waiting on
// it, by resource. The connection is opened by the first wait and kept
// until Close; when it fails, the waits on it fail closed and the next
// wait opens a new one. The zero value is ready to use.
type listener struct {
	mu      sync.Mutex
	gen     *listenGen
	waits   map[string]*resourceWait
	stopped bool
}

// listenGen is one listening connection: ready is closed once LISTEN
// succeeded, done when the connection ended, with err (matching
// fencing.ErrUnavailable) set before.
type listenGen struct {
	ready, done chan struct{}
	err         error
	cancel      context.CancelFunc
	pid         uint32 // the connection's server process, set before ready
}

// resourceWait is the waits of this Store on one resource: wake is closed
// (and replaced) on every notification for it.
type resourceWait struct {
	resource string
	refs     int
	wake     chan struct{}
	gen      *listenGen
}

// join registers a wait on resource, opening the listening connection if
// none runs, and returns once it listens; or fails closed.
func (l *listener) join(ctx context.Context, s *Store, resource string) (*resourceWait, error) {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: barrier wait: the postgres store is closed", fencing.ErrUnavailable)
	}
	if l.gen == nil || isDone(l.gen.done) {
		l.gen = l.start(s)
	}
	if l.waits == nil {
		l.waits = map[string]*resourceWait{}
	}
	w := l.waits[resource]
	if w == nil || w.gen != l.gen {
		w = &resourceWait{resource: resource, wake: make(chan struct{}), gen: l.gen}
		l.waits[resource] = w
	}
	w.refs++
	gen := l.gen
	l.mu.Unlock()
	select {
	case <-gen.ready:
		return w, nil
	case <-gen.done:
		l.leave(w)
		return nil, gen.err
	case <-ctx.Done():
		l.leave(w)
		return nil, ctx.Err()
	}
}

func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// leave drops one reference to w.
func (l *listener) leave(w *resourceWait) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w.refs--
	if w.refs == 0 && l.waits[w.resource] == w {
		delete(l.waits, w.resource)
	}
}

func (l *listener) wakeChan(w *resourceWait) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return w.wake
}

// notify wakes the waits on resource.
func (l *listener) notify(resource string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.waits[resource]; w != nil {
		close(w.wake)
		w.wake = make(chan struct{})
	}
}

// start opens a listening connection in a new goroutine. Called with l.mu
// held.
func (l *listener) start(s *Store) *listenGen {
	ctx, cancel := context.WithCancel(context.Background())
	g := &listenGen{ready: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(g.done)
		err := l.run(ctx, s, g)
		if ctx.Err() != nil {
			g.err = fmt.Errorf("%w: barrier wait: the postgres store is closed", fencing.ErrUnavailable)
		} else {
			g.err = classify("barrier wait: listening connection", err, false)
		}
	}()
	return g
}

// run connects, listens and routes notifications until the connection
// fails or ctx ends.
func (l *listener) run(ctx context.Context, s *Store, g *listenGen) error {
	cfg := s.pool.Config().ConnConfig
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err == nil {
		_, err = conn.Exec(cctx, "LISTEN "+barrierChannel)
	}
	cancel()
	if conn != nil {
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			conn.Close(cctx)
		}()
	}
	if err != nil {
		return err
	}
	g.pid = conn.PgConn().PID()
	close(g.ready)
	prefix := s.schema + " "
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if res, ok := strings.CutPrefix(n.Payload, prefix); ok {
			l.notify(res)
		}
	}
}

// stop ends the listening connection for good and waits for it.
func (l *listener) stop() {
	l.mu.Lock()
	l.stopped = true
	g := l.gen
	l.mu.Unlock()
	if g != nil {
		g.cancel()
		<-g.done
	}
}
