package valkeystore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/fencegate/fencegate/fencing"
)

// scanCount is the COUNT hint of each SCAN call.
const scanCount = 1000

// List implements fencing.Store.
//
// There is no global index of live leases: a sorted set per prefix would be
// one key in one cluster slot, touched by every acquire, and could not be
// updated in the same single-slot script as the lease. Instead each live
// lease has an index key P:{R}:live that expires with the lease (PXAT, the
// server's clock), and List
//
//  1. SCANs the data set with MATCH P:{<prefix>*}:live: on a single node,
//     that node; in a cluster, the primary of every shard (replicas hold
//     copies and are skipped, so a dead replica does not fail List; a
//     primary that does not answer fails it with a store fault),
//  2. runs list.lua once per resource found (one slot each, pipelined by the
//     client) to confirm the lease is live at the server's time,
//  3. sorts by resource and returns the first Limit after After.
//
// Cost: the SCAN visits every key of every primary, O(total keys), whatever
// the prefix, limit or page cursor (ListRequest.After), plus one script per
// live lease matching the prefix after the cursor, up to the limit. Every
// page scans again: listing L live leases in pages of P among K keys costs
// about K*L/P key visits. Fine for an operator's listing of thousands of
// leases; not a hot path.
// The result is not one snapshot: a lease taken or ended while List runs
// may or may not be included.
func (s *Store) List(ctx context.Context, req fencing.ListRequest) ([]fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := s.checkOpen("list"); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*s.cmdTimeout)
	defer cancel()
	pattern := s.prefix + ":{" + req.Prefix + "*}:live"
	head, tail := s.prefix+":{", "}:live"
	nodes, err := s.primaries(ctx)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	found := map[string]bool{}
	for _, node := range nodes {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(pattern).Count(scanCount).Build()).AsScanEntry()
			if err != nil {
				return nil, classify("list", err)
			}
			for _, k := range e.Elements {
				if r, ok := strings.CutPrefix(k, head); ok {
					if r, ok = strings.CutSuffix(r, tail); ok && fencing.ValidateResource(r) == nil && req.Wants(r) {
						found[r] = true
					}
				}
			}
			cursor = e.Cursor
			if cursor == 0 {
				break
			}
		}
	}
	names := make([]string, 0, len(found))
	for r := range found {
		names = append(names, r)
	}
	slices.Sort(names)

	// Check the candidates in resource order, a batch at a time, until
	// Limit live leases are found; calls within a batch run concurrently
	// and share the client's pipelines.
	limit := req.EffectiveLimit()
	leases := []fencing.Lease{}
	const batch = 64
	for i := 0; i < len(names) && len(leases) < limit; i += batch {
		part := names[i:min(i+batch, len(names))]
		got := make([]*fencing.Lease, len(part))
		errs := make([]error, len(part))
		var wg sync.WaitGroup
		for j, r := range part {
			wg.Go(func() { got[j], errs[j] = s.liveLease(ctx, r) })
		}
		wg.Wait()
		for j := range part {
			if errs[j] != nil {
				return nil, errs[j]
			}
			if got[j] != nil && len(leases) < limit {
				leases = append(leases, *got[j])
			}
		}
	}
	return leases, nil
}

// liveLease runs list.lua for one resource.
func (s *Store) liveLease(ctx context.Context, res string) (*fencing.Lease, error) {
	r, err := s.run(ctx, "list", listScript, []string{s.recKey(res)}, nil)
	if err != nil {
		return nil, err
	}
	l, n := decodeList(r)
	if err := n.err(); err != nil {
		return nil, err
	}
	if !l.live {
		return nil, nil
	}
	lease := l.lease.of(res, l.owner)
	return &lease, nil
}
