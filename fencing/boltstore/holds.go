package boltstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fencegate/fencegate/fencing"
)

// The gate's hold record (fencing.HoldRecorder) is one JSON value in its own
// bucket, written in one fsynced transaction at start and at a clean stop.
var (
	bucketGate  = []byte("gate")
	keyGateRun  = []byte("run")
	gateRunning = "running"
)

type gateRecord struct {
	State string               `json:"state"` // "running" or "stopped"
	Holds map[string]time.Time `json:"holds,omitempty"`
}

// StartHolds implements fencing.HoldRecorder.
func (s *Store) StartHolds(ctx context.Context) (fencing.PreviousHolds, error) {
	if err := ctx.Err(); err != nil {
		return fencing.PreviousHolds{}, err
	}
	var prev fencing.PreviousHolds
	err := s.updateAlone(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketGate)
		if err != nil {
			return err
		}
		if v := b.Get(keyGateRun); v != nil {
			var rec gateRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("gate hold record: %w", err)
			}
			prev = fencing.PreviousHolds{Unclean: rec.State == gateRunning, Holds: rec.Holds}
		}
		return putGate(b, gateRecord{State: gateRunning})
	})
	if err != nil {
		return fencing.PreviousHolds{}, err
	}
	return prev, nil
}

// EndHolds implements fencing.HoldRecorder.
func (s *Store) EndHolds(ctx context.Context, holds map[string]time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.updateAlone(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketGate)
		if err != nil {
			return err
		}
		return putGate(b, gateRecord{State: "stopped", Holds: holds})
	})
}

func putGate(b *bolt.Bucket, rec gateRecord) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return b.Put(keyGateRun, v)
}
