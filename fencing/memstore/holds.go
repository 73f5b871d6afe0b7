package memstore

import (
	"context"
	"maps"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// gateHolds is the gate's hold record (fencing.HoldRecorder). It lives as
// long as the Store: a process restart forgets it, like everything here.
type gateHolds struct {
	running bool
	holds   map[string]time.Time
}

// StartHolds implements fencing.HoldRecorder.
func (s *Store) StartHolds(ctx context.Context) (fencing.PreviousHolds, error) {
	if err := s.lock(); err != nil {
		return fencing.PreviousHolds{}, err
	}
	defer s.mu.Unlock()
	prev := fencing.PreviousHolds{Unclean: s.gate.running, Holds: maps.Clone(s.gate.holds)}
	s.gate = gateHolds{running: true}
	return prev, nil
}

// EndHolds implements fencing.HoldRecorder.
func (s *Store) EndHolds(ctx context.Context, holds map[string]time.Time) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.gate = gateHolds{holds: maps.Clone(holds)}
	return nil
}
