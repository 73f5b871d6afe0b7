package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/fencing"
)

// classify turns a raw pgx error of operation op into a fencing fault. It
// runs inside the adapter, before anything else wraps the error.
// committing says whether err came from a COMMIT (or a statement that
// commits by itself) that changes data:
//
//   - the server answered with an error (*pgconn.PgError: statement
//     timeout, shutdown, serialization failure, …): the transaction was
//     rolled back -> fencing.ErrUnavailable;
//   - no answer to anything but a committing statement (connection refused
//     or lost, timeout): an open transaction cannot commit without its
//     COMMIT, so nothing changed -> fencing.ErrUnavailable;
//   - no answer to a committing statement -> fencing.ErrAmbiguous: it may
//     have committed. pgconn.SafeToRetry cannot tell here: when the
//     connection breaks while pgx reads a simple query's reply, pgx reports
//     "conn closed" marked safe to retry although COMMIT was sent. A
//     COMMIT is only sent on a connection that just answered the
//     transaction's statements, so every failure of it counts as sent.
//
// Both fail closed; only ErrUnavailable promises nothing changed. Server
// messages are kept in the error for logs; they never carry the password.
func classify(op string, err error, committing bool) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		return fmt.Errorf("%w: %s: the server refused it (SQLSTATE %s): %s", fencing.ErrUnavailable, op, pgErr.Code, pgErr.Message)
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return fmt.Errorf("%w: %s: the transaction was rolled back", fencing.ErrUnavailable, op)
	case !committing:
		return fmt.Errorf("%w: %s: %w", fencing.ErrUnavailable, op, err)
	default:
		return fmt.Errorf("%w: %s: no answer to COMMIT: %w", fencing.ErrAmbiguous, op, err)
	}
}

// errSyncCommitOff is why a session whose synchronous_commit is off is
// refused: at Open, at every new connection (checkSession) and by every
// write transaction (syncOff).
var errSyncCommitOff = errors.New("synchronous_commit is off: a token or a mark could be acknowledged before it is durable, " +
	"and be lost in a crash of the database; turn it on (or leave it at the server's default) for fencegate's user and database")

// syncOffErr refuses operation op, which changed nothing, on a session
// whose synchronous_commit is off.
func syncOffErr(op string) error {
	return fmt.Errorf("%w: %s: %w", fencing.ErrUnavailable, op, errSyncCommitOff)
}

// standbyErr refuses operation op, answered by a server in recovery (a
// pooler sent the statement to a standby: see onStandby); nothing was
// changed or relied on.
func standbyErr(op string) error {
	return fmt.Errorf("%w: %s: the statement ran on a standby (pg_is_in_recovery), whose rows may lag the primary's; "+
		"fencegate needs the primary for every statement: a pooler in front must not send its reads to standbys", fencing.ErrUnavailable, op)
}

// connectionLost reports a failure that closed the connection without a
// server answer, before COMMIT was sent: worth one more try on a fresh
// connection (a pooled connection that a restarted server had closed).
func connectionLost(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Connections closed by an administrator or a server restart.
		return pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || pgconn.Timeout(err) {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return false // the server is down: trying again now will not help
	}
	return true
}

// retryableRead reports a read-only statement's failure that the server
// asks to retry (serialization failure, deadlock, a hot standby conflict).
func retryableRead(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
