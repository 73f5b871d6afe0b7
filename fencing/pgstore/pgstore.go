// Package pgstore is the fencing.Store kept in PostgreSQL (13 or newer),
// shared by many gates, behind FENCEGATE_STORE=postgres://… (pgx, one
// connection pool per store).
//
// Every operation is one short transaction on the resource's row. A write
// (Acquire, Renew, Release, Checkpoint, and Admit when it raises the mark)
// locks the row with SELECT … FOR UPDATE, reading the database's
// clock_timestamp() after the lock is granted; decides in Go with
// fencing/record, the lease state machine the memory and file stores use;
// writes the row back; and commits. Keeping the decision in record (rather
// than re-stating it in SQL or PL/pgSQL) leaves one definition of the lease
// semantics for every store, at the cost of two more round trips per write
// than a single UPDATE … RETURNING. Reads (Status, ReadCheckpoint, List, and
// Admit at the current mark, the gate's common case) are single statements
// that lock nothing and write nothing.
//
// Expiry is judged by the database server's clock, never the gate's, so
// gates with skewed clocks agree. Times are kept as timestamptz rounded to
// milliseconds (what the API shows).
//
// Durability: a call that issued a token or raised a high-water mark
// returns only after its COMMIT was acknowledged, so with the server's
// defaults (fsync on, synchronous_commit on) the new counter is on disk. A
// session whose synchronous_commit is off is refused at any time: by Open,
// by every new connection, and by every write transaction, which then
// rolls back (fencing.ErrUnavailable); a stronger setting (remote_apply, …)
// is left alone. Sessions run READ
// COMMITTED whatever the database's default (Open sets it, and refuses a
// URL or pooler that imposes another level): the shared barrier relies on
// each statement seeing what committed before it. With synchronous
// replication (synchronous_standby_names and synchronous_commit on or
// remote_apply) it also is on a standby before it is relied on, and a
// failover to that standby keeps every token.
//
// The store needs the primary: every new connection is checked (not in
// recovery, not read-only), so a multi-host URL or a pooler never lands
// on a hot standby, whose rows may lag; a URL asking for another
// target_session_attrs than read-write or primary is refused. Sessions pin
// search_path (pg_catalog, pg_temp), DateStyle (ISO) and IntervalStyle
// (postgres) unless the URL sets them, and every function in the store's
// SQL is qualified with pg_catalog.
//
// Limits: a database restored from an older backup, or a failover to an
// asynchronous standby that lagged, rolls the counters back: tokens issued
// after the backup may be issued again, and a token superseded after it may
// be admitted again until a newer one is. This store does not detect that;
// move the marks forward by hand after such a restore (UPDATE … SET issued =
// issued + N, high_water = …) or use synchronous replication.
//
// Layout, under the schema Options.Schema (default "fencegate"), created or
// migrated by Open under a transaction-scoped advisory lock, so several
// gates may start at once:
//
//	schema_version  one row per applied migration; Open refuses a schema
//	                newer than it knows.
//	resources       one row per resource: issued and high-water tokens, the
//	                most recent lease (live, expired or released), how the
//	                lease before it ended, checkpoint metadata. Rows are
//	                never deleted. Primary key on resource in the "C"
//	                collation, so List's prefix is a range scan in byte order.
//	checkpoints     the last checkpoint state of each resource, as the bytes
//	                the holder sent, kept apart so that renewals and
//	                admissions never rewrite a large state.
//	barrier         the shared barrier's entries: writes in flight through
//	                any gate (barrier.go).
//
// Faults are classified inside the adapter: a failure before COMMIT was
// sent (connection refused, a lost connection, a statement timeout, any
// server error) rolled the transaction back and matches
// fencing.ErrUnavailable; a COMMIT whose reply did not arrive matches
// fencing.ErrAmbiguous. An operation that lost its connection before
// sending COMMIT (a pooled connection a database restart closed), or whose
// insert of a new resource's row lost the race to another transaction, is
// tried again (three tries in all, within the statement timeout); so are
// read-only statements after a serialization failure or deadlock. Nothing
// that may have committed is retried.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/retention"
	"github.com/fencegate/fencegate/internal/redact"
)

// Defaults for Options.
const (
	DefaultSchema           = "fencegate"
	DefaultStatementTimeout = 2 * time.Second
	// MinServerVersion is the oldest PostgreSQL Open accepts, as
	// server_version_num.
	MinServerVersion = 130000
	// DefaultMaxConns is the connection pool's size when the URL sets no
	// pool_max_conns (and pgxpool's own default, max(4, CPUs), is
	// smaller): concurrent operations each hold a connection for their
	// transaction, and PostgreSQL commits concurrent transactions with
	// shared WAL flushes, so a small pool serializes what the server
	// would not.
	DefaultMaxConns = 16
)

// Options configure a Store.
type Options struct {
	// URL is a postgres:// or postgresql:// URL with libpq's parameters
	// (sslmode, sslrootcert, connect_timeout, application_name, …) and
	// pgxpool's (pool_max_conns, default DefaultMaxConns, …). Note that pgx, like libpq, also takes
	// unset settings from the process's PG* environment variables and
	// ~/.pgpass. target_session_attrs (or PGTARGETSESSIONATTRS) may be
	// absent, read-write or primary: connections go to the primary only.
	URL string
	// Password is used when the URL has none (the caller passes
	// PGPASSWORD from its configuration). It overrides what pgx found in
	// the process environment.
	Password string
	// Schema holds the store's tables; "" means DefaultSchema. 1 to 63
	// bytes of a-z, 0-9 and _, not starting with a digit.
	Schema string
	// StatementTimeout bounds every operation: the client gives up after
	// it, and the server's statement_timeout (unless the URL sets one) is
	// the same. 0 means DefaultStatementTimeout.
	StatementTimeout time.Duration
	// MaxCheckpointBytes limits checkpoint state; 0 means
	// fencing.DefaultMaxCheckpointBytes.
	MaxCheckpointBytes int
	// Logger receives start-up warnings; nil discards them.
	Logger *slog.Logger
	// Retention removes a record with no live lease and no barrier entry,
	// untouched for this long (FENCEGATE_RETENTION), with its checkpoint;
	// 0 keeps every record. A background sweep runs every SweepInterval
	// (0: retention.Interval(Retention)) until Close; Sweep runs one pass
	// now.
	Retention     time.Duration
	SweepInterval time.Duration
	// SweepBatch is how many records one sweep statement removes at most;
	// 0 means retention.DefaultBatch.
	SweepBatch int
}

// Store is the PostgreSQL fencing.Store. Safe for concurrent use, by many
// processes on one database.
type Store struct {
	pool     *pgxpool.Pool
	schema   string
	sql      statements
	timeout  time.Duration
	maxState int
	version  string
	closed   atomic.Bool
	listen   listener // the shared barrier's LISTEN connection

	retention time.Duration
	batch     int
	stats     retention.Stats
	sweeper   *retention.Loop
}

var (
	_ fencing.Store    = (*Store)(nil)
	_ fencing.Retainer = (*Store)(nil)
)

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema checks a schema name (see Options.Schema).
func ValidateSchema(name string) error {
	if !schemaName.MatchString(name) {
		return fmt.Errorf("schema %q: want 1 to 63 bytes of a-z, 0-9 and _, not starting with a digit", name)
	}
	return nil
}

// Open connects, checks the server (version, synchronous_commit, the
// primary), and creates or migrates the schema. An unreachable server, or
// one that is a standby or read-only (a failover under way), is an error
// matching fencing.ErrUnavailable; a bad URL or option (target_session_attrs
// other than read-write or primary), synchronous_commit off, an
// unsupported server or a schema written by a newer fencegate are not.
func Open(ctx context.Context, opts Options) (*Store, error) {
	cfg, err := poolConfig(opts)
	if err != nil {
		return nil, err
	}
	schema := opts.Schema
	if schema == "" {
		schema = DefaultSchema
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	if opts.MaxCheckpointBytes < 0 {
		return nil, fmt.Errorf("pgstore: MaxCheckpointBytes %d is negative", opts.MaxCheckpointBytes)
	}
	if opts.MaxCheckpointBytes == 0 {
		opts.MaxCheckpointBytes = fencing.DefaultMaxCheckpointBytes
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	s := &Store{
		pool:      pool,
		schema:    schema,
		sql:       newStatements(pgx.Identifier{schema}.Sanitize()),
		timeout:   opts.StatementTimeout,
		maxState:  opts.MaxCheckpointBytes,
		retention: max(opts.Retention, 0),
		batch:     opts.SweepBatch,
	}
	if s.batch <= 0 {
		s.batch = retention.DefaultBatch
	}
	if err := s.start(ctx, opts.Logger); err != nil {
		pool.Close()
		return nil, err
	}
	if s.retention > 0 {
		every := opts.SweepInterval
		if every <= 0 {
			every = retention.Interval(s.retention)
		}
		s.sweeper = retention.Start(every, s.sweep, &s.stats, opts.Logger)
	}
	return s, nil
}

// poolConfig parses the URL and applies the options to it.
func poolConfig(opts Options) (*pgxpool.Config, error) {
	u, err := url.Parse(opts.URL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("pgstore: URL must be postgres://… or postgresql://…")
	}
	if opts.StatementTimeout < 0 {
		return nil, fmt.Errorf("pgstore: StatementTimeout %v is negative", opts.StatementTimeout)
	}
	cfg, err := pgxpool.ParseConfig(opts.URL)
	if err != nil {
		// pgx's parse errors may quote the URL: never show a password.
		return nil, fmt.Errorf("pgstore: invalid URL %s: %v", redact.Parsed(u), redact.Message(err.Error(), opts.URL, u))
	}
	if _, has := u.User.Password(); !has && opts.Password != "" {
		cfg.ConnConfig.Password = opts.Password
	}
	if !u.Query().Has("pool_max_conns") && cfg.MaxConns < DefaultMaxConns {
		// pgxpool's default, max(4, CPUs), makes a gate on a small
		// machine queue its operations behind 4 connections while the
		// server would run them concurrently and share its WAL flushes
		// among them.
		cfg.MaxConns = DefaultMaxConns
	}
	rp := cfg.ConnConfig.RuntimeParams
	if _, ok := rp["statement_timeout"]; !ok {
		d := opts.StatementTimeout
		if d == 0 {
			d = DefaultStatementTimeout
		}
		rp["statement_timeout"] = strconv.FormatInt(d.Milliseconds(), 10)
	}
	if _, ok := rp["idle_in_transaction_session_timeout"]; !ok {
		// A gate that vanished mid-transaction must not hold a row lock
		// for long: its transaction is ended by the server.
		rp["idle_in_transaction_session_timeout"] = "10000"
	}
	if _, ok := rp["default_transaction_isolation"]; !ok {
		// Every statement must see what committed before it started (the
		// shared barrier's registration counts the entries committed while
		// its raise waited for the row's lock): READ COMMITTED, whatever
		// the database's or role's default. Start-up refuses a session
		// that runs another level.
		rp["default_transaction_isolation"] = "read committed"
	}
	if _, ok := rp["application_name"]; !ok {
		rp["application_name"] = "fencegate"
	}
	for name, value := range pinned {
		if !hasParam(rp, name) {
			rp[name] = value
		}
	}
	// The store decides on the rows a write would lock: only the primary
	// has them up to date. A hot standby's replay may lag (or be paused),
	// and an admission at the mark decided there could admit a token the
	// primary has superseded. libpq's and pgx's default is "any", which
	// lets a multi-host URL (or a pooler) land on a standby.
	tsa, set := u.Query().Get("target_session_attrs"), u.Query().Has("target_session_attrs")
	if !set {
		tsa = os.Getenv("PGTARGETSESSIONATTRS") // as pgx reads it
	}
	switch tsa {
	case "", "any", "read-write", "primary": // checkSession holds every one to a writable primary
	default:
		return nil, fmt.Errorf("pgstore: target_session_attrs=%s: fencegate needs the primary, writable (a standby's rows may lag "+
			"behind it, and a superseded token could be admitted): leave target_session_attrs out, or set it to any, read-write or primary", tsa)
	}
	cfg.ConnConfig.ValidateConnect = checkSession
	return cfg, nil
}

// pinned are the session settings Open sets unless the URL sets them
// (whatever the database's or role's defaults): the store's statements
// resolve names in pg_catalog first (every function is qualified too; this
// also covers operators and types), and pgx reads dates and intervals in
// the text query modes (exec, simple_protocol) in these styles only.
var pinned = map[string]string{
	"search_path":   "pg_catalog, pg_temp",
	"DateStyle":     "ISO",
	"IntervalStyle": "postgres",
}

// hasParam reports whether the URL set the server setting name (the
// server's names are case-insensitive).
func hasParam(rp map[string]string, name string) bool {
	for k := range rp {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// checkSession is every new connection's ValidateConnect (the pool's and
// the shared barrier's listening one): it refuses a server in recovery (a
// standby), a read-only session and a session whose synchronous_commit is
// off, in one round trip. With several hosts in the URL the next one is
// tried; when none passes, the connection fails, which the operation that
// wanted it reports as fencing.ErrUnavailable. Checking each new
// connection suffices for the standby: a primary becomes a standby only
// through a restart, which ends its sessions (a standby promoted later is
// accepted by the next connection). synchronous_commit changed by ALTER
// ROLE or ALTER DATABASE reaches only new sessions, checked here; one
// changed for sessions already open (ALTER SYSTEM and a reload) is caught
// by every write transaction (syncOff in schema.go).
func checkSession(ctx context.Context, c *pgconn.PgConn) error {
	rs, err := c.Exec(ctx, `SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only'),
		pg_catalog.current_setting('synchronous_commit')`).ReadAll()
	if err != nil {
		return err
	}
	if len(rs) != 1 || len(rs[0].Rows) != 1 || len(rs[0].Rows[0]) != 3 {
		return errors.New("pgstore: unexpected reply to the session check")
	}
	v := rs[0].Rows[0]
	switch {
	case string(v[0]) == "t":
		return errStandby
	case string(v[1]) == "on":
		return errReadOnly
	case string(v[2]) == "off":
		return errSyncCommitOff
	}
	return nil
}

var (
	errStandby  = errors.New("the server is a standby (in recovery): fencegate needs the primary")
	errReadOnly = errors.New("the session is read-only (transaction_read_only is on): fencegate needs the primary, writable")
)

// start checks the server and migrates the schema.
func (s *Store) start(ctx context.Context, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var num, version, syncCommit, fsync, timeout, isolation string
	err := s.pool.QueryRow(ctx, `SELECT pg_catalog.current_setting('server_version_num'), pg_catalog.current_setting('server_version'),
		pg_catalog.current_setting('synchronous_commit'), pg_catalog.current_setting('fsync'),
		pg_catalog.current_setting('statement_timeout'), pg_catalog.current_setting('transaction_isolation')`).
		Scan(&num, &version, &syncCommit, &fsync, &timeout, &isolation)
	if errors.Is(err, errSyncCommitOff) {
		// A setting to change, not an outage.
		return fmt.Errorf("pgstore: %w", errSyncCommitOff)
	}
	if err != nil {
		return classify("connect", err, false)
	}
	n, _ := strconv.Atoi(num)
	if n < MinServerVersion {
		return fmt.Errorf("pgstore: PostgreSQL %s is not supported: fencegate needs 13 or newer", version)
	}
	if syncCommit == "off" {
		return fmt.Errorf("pgstore: %w", errSyncCommitOff)
	}
	if isolation != "read committed" {
		return fmt.Errorf("pgstore: the session's transaction isolation is %q: fencegate needs read committed, where each statement sees "+
			"what committed before it (under a snapshot taken earlier, a write could pass while a lower-token write is in flight); "+
			"remove default_transaction_isolation from the URL, or let the connection pooler pass it", isolation)
	}
	if fsync == "off" {
		log.Warn("postgres store: the server runs with fsync=off: a crash of its host can lose issued tokens and high-water marks, and tokens may then repeat")
	}
	s.version = version
	if s.timeout == 0 {
		// The URL's statement_timeout (or the default) bounds the client too.
		s.timeout = DefaultStatementTimeout
		if d, err := time.ParseDuration(strings.TrimSpace(timeout)); err == nil && d > 0 {
			s.timeout = d
		} else if ms, err := strconv.Atoi(timeout); err == nil && ms > 0 {
			s.timeout = time.Duration(ms) * time.Millisecond
		}
	}
	return s.migrate(ctx)
}

// ServerVersion is the server's version, as it reported it at Open.
func (s *Store) ServerVersion() string { return s.version }

// Schema is the schema holding the store's tables.
func (s *Store) Schema() string { return s.schema }

// Ping implements fencing.Store: one round trip on a pooled connection.
func (s *Store) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("%w: ping: the postgres store is closed", fencing.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.pool.Exec(ctx, ";")
	return classify("ping", err, false)
}

// Close implements fencing.Store: it closes the shared barrier's listening
// connection (its waits fail closed) and the pool, waiting for connections
// in use to be returned. Calling it again is harmless.
func (s *Store) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		s.sweeper.Stop()
		s.listen.stop()
		s.pool.Close()
	}
	return nil
}
