package valkeystore

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/fencegate/fencegate/fencing"
	"github.com/valkey-io/valkey-go"
)

// Server error replies that mean the command was refused before it ran, so
// nothing changed: the store is unavailable, not ambiguous.
var notPerformed = []string{
	"LOADING", "BUSY", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "MASTERDOWN",
	"OOM", "NOREPLICAS", "MISCONF", "NOAUTH", "WRONGPASS", "NOPERM", "MOVED", "ASK",
}

// classify turns a raw valkey-go error of operation op into a fencing fault.
// It runs inside the adapter, before anything else wraps the error:
//
//   - the request was never sent (dial failure, connection refused, client
//     closed, server refused it before running: LOADING, BUSY, OOM, ...) ->
//     fencing.ErrUnavailable;
//   - anything after the request may have been sent (timeout, reset or EOF
//     on an established connection, the caller's context ending, a script
//     error that may follow a partial write) -> fencing.ErrAmbiguous.
//
// Both fail closed; only ErrUnavailable promises nothing changed.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if verr, ok := valkey.IsValkeyErr(err); ok {
		msg := verr.Error()
		for _, p := range notPerformed {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("%w: %s: the server refused it: %v", fencing.ErrUnavailable, op, verr)
			}
		}
		return fmt.Errorf("%w: %s: server error: %v", fencing.ErrAmbiguous, op, verr)
	}
	if neverSent(err) {
		return fmt.Errorf("%w: %s: %w", fencing.ErrUnavailable, op, err)
	}
	return fmt.Errorf("%w: %s: no answer after sending: %w", fencing.ErrAmbiguous, op, err)
}

// neverSent reports errors that happen before a request leaves the client.
func neverSent(err error) bool {
	if errors.Is(err, valkey.ErrClosing) || errors.Is(err, valkey.ErrNoSlot) || errors.Is(err, valkey.ErrNoAddr) {
		return true
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}
