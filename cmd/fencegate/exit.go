package main

import (
	"errors"
	"fmt"
)

// Exit statuses of the fencegate binary. Subcommands return an *exitError
// to choose one; any other error exits with exitFailure.
const (
	exitOK          = 0
	exitFailure     = 1   // start-up or runtime failure
	exitUsage       = 2   // bad flags, arguments or configuration
	exitRefused     = 3   // the server refused (lease-held, lease-lost, no-checkpoint, ...)
	exitUnavailable = 4   // the server or its store could not be reached
	exitNotAcquired = 75  // fencegate run: lease not acquired within --wait
	exitLeaseLost   = 76  // fencegate run: lease lost while the command ran
	exitInterrupted = 130 // SIGINT or SIGTERM ended a call before its answer (128+SIGINT, as shells report)
)

// exitError is an error that ends the process with a given status. A nil
// err with a non-zero code exits silently (the subcommand already said
// why).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// withExit wraps err so the process exits with code.
func withExit(code int, err error) error { return &exitError{code: code, err: err} }

// exitCode maps run's error to the process exit status, and reports
// whether the error should be printed.
func exitCode(err error) (code int, print bool) {
	if err == nil {
		return exitOK, false
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, ee.err != nil
	}
	return exitFailure, true
}
