//go:build !linux

package proxy

import (
	"context"
	"net"
)

// loopEngine: the event loops run on Linux only; elsewhere the general
// engine (net/http's server) serves every connection.
type loopEngine struct{ closing interface{ Load() bool } }

func newLoopEngine(*Server, net.Listener) (*loopEngine, error) { return nil, nil }
func (e *loopEngine) serve() error                             { return nil }
func (e *loopEngine) shutdown(context.Context) error           { return nil }
func (e *loopEngine) close(context.Context) error              { return nil }
func (e *loopEngine) count() int                               { return 0 }
