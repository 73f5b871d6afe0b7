package valkeystore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// DefaultPolicyCheckInterval is how often a Store re-checks every node's
// maxmemory-policy and persistence when Options.PolicyCheckInterval is 0.
const DefaultPolicyCheckInterval = 5 * time.Second

// Eviction and persistence, re-checked while running.
//
// Open refuses a server whose maxmemory-policy is not noeviction. The policy
// can change at runtime (CONFIG SET), and an evicting server drops token
// counters, marks and leases silently. So a Store re-reads every node's
// policy and persistence every PolicyCheckInterval. While any node that
// answers has a policy other than noeviction, Ping fails (so /readyz turns
// red) and every operation fails closed with fencing.ErrUnavailable
// (nothing is sent: writes are answered 503 not-done). The change is
// logged once when it appears and once when it is gone, and persistence
// changes (AOF turned off or on) are logged once per change.
//
// Limits: a change is seen at the next check, not at once: writes in between
// are served by the evicting server. Nothing evicted is trusted afterwards
// only as far as the store's loss detection goes (seen.go): a record evicted
// whole is re-created above every token this gate saw, and a gate that saw
// it notices the new record; keys evicted from a resource this gate never
// saw are judged by the clocks.

// policyState is the result of one check: the eviction fault ("" when every
// node that answered has noeviction) and each node's persistence summary.
type policyState struct {
	fault       string
	persistence map[string]string
}

// watchPolicy re-checks the nodes every interval until Close.
func (s *Store) watchPolicy(interval time.Duration) {
	defer close(s.watchDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	last := policyState{persistence: map[string]string{}}
	for {
		select {
		case <-s.stopWatch:
			return
		case <-t.C:
			last = s.recheck(last)
		}
	}
}

// recheck reads every node's policy and persistence once, publishes the
// eviction fault, and logs what changed since last.
func (s *Store) recheck(last policyState) policyState {
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.cmdTimeout)
	defer cancel()
	now := policyState{persistence: map[string]string{}}
	var bad []string
	for addr, node := range s.client.Nodes() {
		mem, err := node.Do(ctx, node.B().Info().Section("memory").Build()).ToString()
		if err != nil {
			// Unreachable: Ping and the operations judge that. Keep what
			// was known of this node, its fault included.
			if p, ok := last.persistence[addr]; ok {
				now.persistence[addr] = p
			}
			if strings.Contains(last.fault, "server "+addr+" ") {
				bad = append(bad, fmt.Sprintf("server %s did not answer; it last had an evicting maxmemory-policy", addr))
			}
			continue
		}
		if policy := infoField(mem, "maxmemory_policy"); policy != "noeviction" {
			bad = append(bad, fmt.Sprintf("server %s has maxmemory-policy %q", addr, policy))
		}
		if pers, err := node.Do(ctx, node.B().Info().Section("persistence").Build()).ToString(); err == nil {
			now.persistence[addr] = persistenceSummary(pers)
		}
	}
	slices.Sort(bad)
	now.fault = strings.Join(bad, "; ")
	if now.fault != last.fault {
		s.policyFault.Store(&now.fault)
		if now.fault != "" {
			s.log.Error("valkeystore: a server may evict keys (maxmemory-policy is not noeviction): every operation is refused and /readyz is red until it is noeviction again",
				"fault", now.fault)
		} else {
			s.log.Info("valkeystore: every server has maxmemory-policy noeviction again; operations resume")
		}
	}
	for addr, p := range now.persistence {
		if old, ok := last.persistence[addr]; ok && old != p {
			s.log.Warn("valkeystore: a server's persistence changed", "addr", addr, "was", old, "now", p)
		}
	}
	return now
}

// persistenceSummary describes an INFO persistence reply: whether AOF is on.
func persistenceSummary(info string) string {
	aof := "aof off"
	if infoField(info, "aof_enabled") == "1" {
		aof = "aof on"
	}
	return aof
}

// checkPolicy fails with fencing.ErrUnavailable while the last check found
// an evicting node; nothing is sent then.
func (s *Store) checkPolicy(op string) error {
	if f := s.policyFault.Load(); f != nil && *f != "" {
		return fmt.Errorf("%w: %s: %s; fencegate requires noeviction", fencing.ErrUnavailable, op, *f)
	}
	return nil
}
