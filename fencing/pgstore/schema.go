package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// migrations are applied in order; migrations[i] takes the schema to
// version i+1. Applied migrations are never edited: a change is a new
// entry. "{schema}" is replaced by the quoted schema name.
var migrations = []string{
	// 1: resources and checkpoints.
	`CREATE TABLE {schema}.resources (
		resource       text COLLATE "C" PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 200),
		issued         bigint  NOT NULL DEFAULT 0,
		high_water     bigint  NOT NULL DEFAULT 0,
		owner          text,
		token          bigint,
		ttl_ms         bigint,
		acquired_at    timestamptz,
		expires_at     timestamptz,
		released       boolean NOT NULL DEFAULT false,
		finished       boolean NOT NULL DEFAULT false,
		prior_owner    text,
		prior_token    bigint,
		prior_ended    text CHECK (prior_ended IN ('released', 'expired')),
		prior_finished boolean NOT NULL DEFAULT false,
		cp_token       bigint,
		cp_updated_at  timestamptz,
		cp_size        integer,
		CHECK (0 <= high_water AND high_water <= issued),
		CHECK (token <= issued)
	);
	CREATE TABLE {schema}.checkpoints (
		resource text COLLATE "C" PRIMARY KEY REFERENCES {schema}.resources (resource),
		state    bytea NOT NULL
	);`,
	// 2: the shared barrier's entries (barrier.go).
	`CREATE TABLE {schema}.barrier (
		id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		resource text COLLATE "C" NOT NULL,
		token    bigint NOT NULL,
		gate     text NOT NULL,
		deadline timestamptz NOT NULL
	);
	CREATE INDEX barrier_resource_token ON {schema}.barrier (resource, token);`,
	// 3: tokens on the clock and retention (DESIGN §12): the floor below a
	// fresh record's first token, and when the record was last touched
	// (NULL in rows written before: the sweep then goes by the lease's
	// and checkpoint's times), indexed for the sweep.
	`ALTER TABLE {schema}.resources
		ADD COLUMN floor bigint NOT NULL DEFAULT 0 CHECK (floor >= 0),
		ADD COLUMN touched_at timestamptz;
	CREATE INDEX resources_touched ON {schema}.resources (touched_at);`,
}

// advisoryClass is the first key of the advisory lock that serializes
// migrations of one schema across processes (the second is the schema's
// hash): an arbitrary constant, "fg" in ASCII.
const advisoryClass = 0x6667

// migrate creates the schema or brings it to the newest version, in one
// transaction holding an advisory lock, so that gates starting together
// apply each migration once. It refuses a schema newer than this fencegate.
func (s *Store) migrate(ctx context.Context) error {
	q := pgx.Identifier{s.schema}.Sanitize()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return classify("migrate", err, false)
	}
	defer s.rollback(ctx, tx)
	steps := []string{
		// Waiting for another gate's migration, or creating tables on a
		// busy server, may take longer than one operation may.
		`SET LOCAL statement_timeout = '60s'`,
		fmt.Sprintf(`SELECT pg_catalog.pg_advisory_xact_lock(%d, pg_catalog.hashtext(%s))`, advisoryClass, quoteLiteral(s.schema)),
		`CREATE SCHEMA IF NOT EXISTS ` + q,
		`CREATE TABLE IF NOT EXISTS ` + q + `.schema_version (
			version    integer PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT pg_catalog.now())`,
	}
	for _, sql := range steps {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return migrateErr(err)
		}
	}
	var version int
	if err := tx.QueryRow(ctx, `SELECT coalesce(pg_catalog.max(version), 0) FROM `+q+`.schema_version`).Scan(&version); err != nil {
		return migrateErr(err)
	}
	if version > len(migrations) {
		return fmt.Errorf("pgstore: schema %s is at version %d, this fencegate knows up to %d: upgrade fencegate", s.schema, version, len(migrations))
	}
	for v := version + 1; v <= len(migrations); v++ {
		if _, err := tx.Exec(ctx, strings.ReplaceAll(migrations[v-1], "{schema}", q)); err != nil {
			return migrateErr(fmt.Errorf("migration %d: %w", v, err))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.schema_version (version) VALUES ($1)`, v); err != nil {
			return migrateErr(err)
		}
	}
	return migrateErr(tx.Commit(ctx))
}

// migrateErr keeps a refused migration (permissions, a conflicting table)
// apart from an unreachable server: only the latter is a store fault.
func migrateErr(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("pgstore: creating or migrating the schema: %w", err)
	}
	return classify("migrate", err, false)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// statements are the SQL of the operations, for one schema.
type statements struct {
	readLocked, readShared, read, readCheckpoint string
	insert, update, updateIf, saveState          string
	list, sweepLock, sweepRemove                 string
	register, check, leave                       string
}

// recordColumns are the columns read into a record.Record, in scan order
// (see scanRecord).
const recordColumns = `issued, high_water, owner, token, ttl_ms, acquired_at, expires_at, released, finished,
	prior_owner, prior_token, prior_ended, prior_finished, cp_token, cp_updated_at, cp_size, floor, touched_at`

// nowMicros is the database's clock in Unix microseconds: tokens follow it
// (DESIGN §12); expiry uses it at millisecond precision.
const nowMicros = `pg_catalog.floor(extract(epoch FROM pg_catalog.clock_timestamp()) * 1000000)::bigint`

// syncOff says whether the statement's session runs with synchronous_commit
// off (a commit acknowledged before its WAL is flushed): a write transaction
// that reads it true rolls back instead of committing (see tryWrite), and an
// updateIf does not write. Open and every new connection refuse such a
// session too (checkSession); this catches a change that reaches sessions
// already open (ALTER SYSTEM and a reload, a pooler's server sessions).
const syncOff = `pg_catalog.current_setting('synchronous_commit') = 'off'`

// onStandby says whether the statement ran on a server in recovery (a hot
// standby). Every new connection is checked to be on a primary
// (checkSession), but a pooler may send a connection's statements to
// other servers (pgpool-II balances read-only statements across
// standbys): a read that says it ran on one is refused (see Store.read),
// for a standby's rows may lag the primary's and a superseded token could
// be admitted at its copy of the mark.
const onStandby = `pg_catalog.pg_is_in_recovery()`

// newStatements builds the statements for the quoted schema. Every
// function they call is qualified with pg_catalog (extract, coalesce and
// greatest are syntax, not looked up), so that a function of the same name
// earlier in the session's search_path (a role's or database's setting,
// or the URL's) never stands in for it.
func newStatements(schema string) statements {
	r := schema + ".resources"
	// One row always: the clock (read after the row lock is granted: the
	// join projects once the locking scan has returned), whether the
	// resource exists, and its record.
	locked := func(mode string) string {
		return `WITH r AS (SELECT ` + recordColumns + ` FROM ` + r + ` WHERE resource = $1 FOR ` + mode + `)
			SELECT ` + nowMicros + `, r.issued IS NOT NULL, ` + syncOff + `, ` + onStandby + `, r.* FROM (VALUES (true)) AS one LEFT JOIN r ON true`
	}
	st := statements{
		readLocked: locked("UPDATE"),
		readShared: locked("SHARE"),
		read: `SELECT ` + nowMicros + `, r.issued IS NOT NULL, ` + syncOff + `, ` + onStandby + `, r.* FROM (VALUES (true)) AS one
			LEFT JOIN (SELECT ` + recordColumns + ` FROM ` + r + ` WHERE resource = $1) r ON true`,
		readCheckpoint: `SELECT ` + nowMicros + `, r.issued IS NOT NULL, ` + syncOff + `, ` + onStandby + `, r.*, c.state FROM (VALUES (true)) AS one
			LEFT JOIN (SELECT ` + recordColumns + ` FROM ` + r + ` WHERE resource = $1) r ON true
			LEFT JOIN ` + schema + `.checkpoints c ON c.resource = $1`,
		insert: `INSERT INTO ` + r + ` (resource, ` + recordColumns + `)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`,
		update: `UPDATE ` + r + ` SET (` + recordColumns + `)
			= ($2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) WHERE resource = $1`,
		// update, only if the row still holds $20 to $37 (recordColumns
		// as read before): the shared barrier's admission raises the mark
		// this way without holding a transaction open over a round trip.
		updateIf: `UPDATE ` + r + ` SET (` + recordColumns + `)
			= ($2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) WHERE resource = $1
			AND (` + recordColumns + `) IS NOT DISTINCT FROM
			($20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36, $37)
			AND NOT ` + syncOff,
		saveState: `INSERT INTO ` + schema + `.checkpoints (resource, state) VALUES ($1, $2)
			ON CONFLICT (resource) DO UPDATE SET state = EXCLUDED.state`,
		// Live leases in byte order: resource >= prefix and < prefix||0x7f
		// is exactly "starts with prefix" for names of bytes below 0x7f,
		// and a range scan of the primary key in the C collation.
		list: `SELECT resource, owner, token, ttl_ms, acquired_at, expires_at FROM ` + r + `
			WHERE resource >= $1 AND resource < $2 AND resource > $4 AND owner IS NOT NULL AND NOT released
			AND expires_at > pg_catalog.clock_timestamp() ORDER BY resource LIMIT $3`,
	}
	st.register, st.check, st.leave = barrierStatements(schema+".barrier", r)
	// One sweep batch (retention, DESIGN §12), two statements in one
	// transaction. sweepLock locks, without waiting for a row another
	// transaction holds, at most $2 rows with no live lease, untouched for
	// the retention $1 (an interval, against the database's clock; counted
	// from the latest of the last touch, the lease's expiry and the
	// checkpoint, as the embedded stores count it) and no barrier entry,
	// and returns their names. Its WHERE is checked again on a row updated
	// since the statement began (READ COMMITTED's recheck of a locked row),
	// but its barrier entries are those of the statement's snapshot: an
	// admission that registered one in between (under the row's shared
	// lock, released at its commit) is not seen. So sweepRemove, a later
	// statement with a snapshot taken once the rows are locked (every entry
	// registered before is committed, none can be registered after), removes
	// the checkpoints and rows of $1 (the names locked) that have no
	// barrier entry, and returns how many rows went.
	st.sweepLock = `WITH now AS (SELECT pg_catalog.clock_timestamp() AS t)
		SELECT resource FROM ` + r + ` x
		WHERE greatest(touched_at, expires_at, acquired_at, cp_updated_at) <= (SELECT t FROM now) - $1::interval
		AND (owner IS NULL OR released OR expires_at <= (SELECT t FROM now))
		AND NOT EXISTS (SELECT 1 FROM ` + schema + `.barrier b WHERE b.resource = x.resource)
		ORDER BY touched_at NULLS FIRST LIMIT $2 FOR UPDATE SKIP LOCKED`
	st.sweepRemove = `WITH idle AS (SELECT resource FROM pg_catalog.unnest($1::text[]) AS x (resource)
			WHERE NOT EXISTS (SELECT 1 FROM ` + schema + `.barrier b WHERE b.resource = x.resource)),
		cp AS (DELETE FROM ` + schema + `.checkpoints WHERE resource IN (SELECT resource FROM idle)),
		gone AS (DELETE FROM ` + r + ` WHERE resource IN (SELECT resource FROM idle) RETURNING 1)
		SELECT pg_catalog.count(*) FROM gone`
	return st
}
