package valkeystore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/valkey-io/valkey-go"
)

// Cluster topology.
//
// The client knows every node of a cluster, replicas included
// (client.Nodes()). Replicas serve none of the store's operations: every
// script runs on the primary that owns its resource's slot. So readiness
// (Ping), List and the start-up checks judge the cluster by its primaries,
// and an unreachable replica never makes them fail; an unreachable primary
// always does, until the cluster fails over and the client has learnt the
// new primary (the client re-reads the slot map every topologyRefresh, and
// at once after a connection error).

// topologyRefresh is how often the client re-reads a cluster's slot map
// (valkey-go's ShardsRefreshInterval), so that it forgets nodes that left or
// failed and learns promoted replicas even when no command failed.
const topologyRefresh = 15 * time.Second

// numSlots is the number of hash slots of a Valkey Cluster.
const numSlots = 16384

// shard is one primary of a cluster and the slot ranges it serves, as
// CLUSTER SLOTS reports them.
type shard struct {
	id     string     // the primary's node ID
	ranges [][2]int64 // inclusive slot ranges
}

// isCluster reports whether the client talks to a Valkey Cluster.
func (s *Store) isCluster() bool { return s.client.Mode() == valkey.ClientModeCluster }

// fanOut returns a context for asking every node at once and keeping the
// first useful answers: detached from the caller's cancellation and bounded
// by the command timeout. valkey-go dials a node's connection with the
// context of the command that needs it first and fails every command
// waiting for that dial when it ends; the calls left behind when a fan-out
// returns early must therefore not end with the caller's context, or they
// would fail the next operations on those nodes.
func (s *Store) fanOut(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.cmdTimeout)
}

// shards reads the slot map from whichever known node answers CLUSTER SLOTS
// first (all are asked at once, so a dead or silent node costs nothing while
// another answers). It fails with fencing.ErrUnavailable when the map leaves
// a slot unserved: a resource in that slot could not be served.
func (s *Store) shards(ctx context.Context, nodes map[string]valkey.Client) ([]shard, error) {
	type answer struct {
		sh  []shard
		err error
	}
	answers := make(chan answer, len(nodes))
	fctx, cancel := s.fanOut(ctx)
	var wg sync.WaitGroup
	for _, node := range nodes {
		wg.Go(func() {
			msgs, err := node.Do(fctx, node.B().ClusterSlots().Build()).ToArray()
			if err != nil {
				answers <- answer{err: err}
				return
			}
			sh, err := parseSlots(msgs)
			answers <- answer{sh, err}
		})
	}
	go func() { wg.Wait(); cancel() }()
	var first error
	for range nodes {
		var a answer
		select {
		case a = <-answers:
		case <-ctx.Done():
			return nil, classify("cluster slots", ctx.Err())
		}
		if a.err == nil {
			return a.sh, nil
		}
		if first == nil {
			first = a.err
		}
	}
	if first == nil {
		return nil, fmt.Errorf("%w: the client knows no cluster node", fencing.ErrUnavailable)
	}
	return nil, classify("cluster slots", first)
}

// parseSlots reads a CLUSTER SLOTS reply: {start, end, {host, port, id,
// ...}, replicas...} per range, grouped by the primary's ID. Every slot
// must be served by exactly one range.
func parseSlots(msgs []valkey.ValkeyMessage) ([]shard, error) {
	var seen [numSlots]bool
	covered := 0
	index := map[string]int{}
	var out []shard
	for _, m := range msgs {
		f, err := m.ToArray()
		if err != nil || len(f) < 3 {
			return nil, errors.New("valkeystore: malformed CLUSTER SLOTS reply")
		}
		lo, err1 := f[0].AsInt64()
		hi, err2 := f[1].AsInt64()
		node, err3 := f[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(node) < 3 || lo < 0 || hi < lo || hi >= numSlots {
			return nil, errors.New("valkeystore: malformed CLUSTER SLOTS reply")
		}
		id, err := node[2].ToString()
		if err != nil || id == "" {
			return nil, errors.New("valkeystore: CLUSTER SLOTS reply without node IDs")
		}
		for i := lo; i <= hi; i++ {
			if !seen[i] {
				seen[i] = true
				covered++
			}
		}
		i, ok := index[id]
		if !ok {
			i = len(out)
			index[id] = i
			out = append(out, shard{id: id})
		}
		out[i].ranges = append(out[i].ranges, [2]int64{lo, hi})
	}
	if covered != numSlots {
		return nil, fmt.Errorf("%w: the cluster serves %d of %d hash slots", fencing.ErrUnavailable, covered, numSlots)
	}
	return out, nil
}

// pingCluster runs ping.lua once per primary, on a key of a slot that
// primary serves, through the client's own slot routing: it proves that the
// client reaches the owner of each part of the slot map, exactly as Admit
// would. A replica's state never enters into it.
func (s *Store) pingCluster(ctx context.Context) error {
	sh, err := s.shards(ctx, s.client.Nodes())
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	errs := make([]error, len(sh))
	var wg sync.WaitGroup
	for i, p := range sh {
		wg.Go(func() {
			key := s.prefix + ":ping{" + slotTag(uint16(p.ranges[0][0])) + "}"
			if _, err := s.run(ctx, "ping", pingScript, []string{key}, nil); err != nil {
				errs[i] = fmt.Errorf("primary %s (slots %d-%d): %w", p.id, p.ranges[0][0], p.ranges[0][1], err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// primaries returns the client of every node to read the whole data set
// from: in a cluster, the node that is each shard's primary (identified by
// CLUSTER MYID, so that unreachable replicas are never waited for); else
// every node the client knows. It fails with fencing.ErrUnavailable when a
// primary is not among the nodes that answered.
func (s *Store) primaries(ctx context.Context) (map[string]valkey.Client, error) {
	nodes := s.client.Nodes()
	if !s.isCluster() {
		return nodes, nil
	}
	sh, err := s.shards(ctx, nodes)
	if err != nil {
		return nil, err
	}
	want := map[string]shard{}
	for _, p := range sh {
		want[p.id] = p
	}
	type answer struct{ addr, id string }
	answers := make(chan answer, len(nodes))
	fctx, cancel := s.fanOut(ctx)
	var wg sync.WaitGroup
	for addr, node := range nodes {
		wg.Go(func() {
			id, err := node.Do(fctx, node.B().ClusterMyid().Build()).ToString()
			if err != nil {
				id = ""
			}
			answers <- answer{addr, id}
		})
	}
	go func() { wg.Wait(); cancel() }()
	out := map[string]valkey.Client{}
	for range nodes {
		var a answer
		select {
		case a = <-answers:
		case <-ctx.Done():
			return nil, classify("cluster myid", ctx.Err())
		}
		if _, ok := want[a.id]; ok {
			delete(want, a.id)
			out[a.addr] = nodes[a.addr]
			if len(want) == 0 {
				return out, nil
			}
		}
	}
	for _, p := range want {
		return nil, fmt.Errorf("%w: the primary %s of hash slots %d-%d does not answer", fencing.ErrUnavailable, p.id, p.ranges[0][0], p.ranges[0][1])
	}
	return out, nil
}

// slotTags[i] is a number whose decimal form hashes to slot i: the hash tag
// of a key in slot i. Computed once, on first use.
var (
	slotTagsOnce sync.Once
	slotTags     [numSlots]uint32
)

// slotTag returns a hash tag (without braces) whose key slot is slot.
func slotTag(slot uint16) string {
	slotTagsOnce.Do(func() {
		var found [numSlots]bool
		left := numSlots
		// Bounded: 0..(1<<20) covers every slot (TestSlotTags).
		for n := uint32(0); left > 0 && n < 1<<20; n++ {
			sl := keySlot(strconv.FormatUint(uint64(n), 10))
			if !found[sl] {
				found[sl] = true
				slotTags[sl] = n
				left--
			}
		}
	})
	return strconv.FormatUint(uint64(slotTags[slot%numSlots]), 10)
}

// keySlot is the cluster hash slot of a key without a hash tag: CRC16
// (XMODEM: polynomial 0x1021, initial value 0) modulo 16384.
func keySlot(key string) uint16 {
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % numSlots
}
