package valkeystore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/valkey-io/valkey-go"
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

// checkNodes enforces noeviction and warns about missing persistence on
// every node the client knows (in a cluster: every primary and replica,
// since a replica may be promoted). Every primary must answer; a cluster
// node that is not a primary and cannot be reached (a dead replica) is
// skipped with a warning, so that a replica being down never stops a gate
// from starting.
func (s *Store) checkNodes(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 2*s.cmdTimeout)
	prim, err := s.primaries(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("valkeystore: %w", err)
	}
	for addr, node := range s.client.Nodes() {
		reached, err := s.checkNode(ctx, addr, node)
		if err == nil {
			continue
		}
		if _, isPrimary := prim[addr]; reached || isPrimary || !s.isCluster() {
			return err
		}
		s.log.Warn("valkeystore: a cluster node that is not a primary does not answer; its maxmemory-policy and persistence are not checked",
			"addr", addr, "error", err)
	}
	return nil
}

// checkNode checks one node; reached reports whether it answered at all.
func (s *Store) checkNode(ctx context.Context, addr string, node valkey.Client) (reached bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*s.cmdTimeout)
	defer cancel()
	mem, err := node.Do(ctx, node.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		return false, fmt.Errorf("valkeystore: INFO memory on %s: %w", addr, classify("check", err))
	}
	policy := infoField(mem, "maxmemory_policy")
	if policy != "noeviction" {
		return true, fmt.Errorf("valkeystore: server %s has maxmemory-policy %q; fencegate requires noeviction, "+
			"because an evicting server may silently drop token counters and high-water marks "+
			"(set maxmemory-policy noeviction: a full server then refuses writes, and fencegate fails closed)", addr, policy)
	}
	pers, err := node.Do(ctx, node.B().Info().Section("persistence").Build()).ToString()
	if err != nil {
		return true, fmt.Errorf("valkeystore: INFO persistence on %s: %w", addr, classify("check", err))
	}
	aof := infoField(pers, "aof_enabled") == "1"
	save := ""
	if kv, err := node.Do(ctx, node.B().ConfigGet().Parameter("save").Build()).AsStrMap(); err == nil {
		save = kv["save"]
	} else {
		s.log.Warn("valkeystore: cannot read the server's save setting (CONFIG GET refused)", "addr", addr, "error", err)
		return true, nil
	}
	if !aof && strings.TrimSpace(save) == "" {
		s.log.Warn("valkeystore: persistence is off on the server (no AOF, no RDB snapshots): a restart loses every lease, checkpoint and high-water mark; "+
			"tokens stay unique and pre-restart tokens are refused, but every holder must re-acquire. Enable appendonly yes (appendfsync always so that a crash loses nothing)",
			"addr", addr)
	} else if !aof {
		s.log.Warn("valkeystore: only RDB snapshots are on: a crash rolls back to the last snapshot; enable appendonly yes", "addr", addr)
	}
	return true, nil
}

// warnFewReplicas logs a warning for each primary that has fewer connected
// replicas than WaitReplicas now: every admission that raises a mark there
// would fail closed until enough replicas connect. It never fails Open.
func (s *Store) warnFewReplicas(ctx context.Context) {
	for addr, node := range s.client.Nodes() {
		cctx, cancel := context.WithTimeout(ctx, s.cmdTimeout)
		info, err := node.Do(cctx, node.B().Info().Section("replication").Build()).ToString()
		cancel()
		if err != nil || infoField(info, "role") != "master" {
			continue
		}
		if n, err := strconv.Atoi(infoField(info, "connected_slaves")); err == nil && n < s.waitReplicas {
			s.log.Warn("valkeystore: a primary has fewer connected replicas than WaitReplicas; admissions that raise a high-water mark there fail with 503 until enough replicas connect",
				"addr", addr, "replicas", n, "wait_replicas", s.waitReplicas)
		}
	}
}

// infoField returns field's value from an INFO reply.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// Ping implements fencing.Store: it succeeds when the store can serve every
// resource now. On a single node: the node answers PING. In a cluster: a
// node reports a slot map that covers every hash slot, and the primary of
// each shard runs a script routed by key, as every operation is. Replicas
// are not consulted: a dead replica never fails Ping; a dead primary fails
// it with a store fault (fencing.ErrUnavailable, or fencing.ErrAmbiguous
// when an open connection broke) until the cluster has promoted a replica
// and the client has learnt it.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.checkOpen("ping"); err != nil {
		return err
	}
	if err := s.checkPolicy("ping"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cmdTimeout)
	defer cancel()
	if s.isCluster() {
		return s.pingCluster(ctx)
	}
	return classify("ping", s.client.Do(ctx, s.client.B().Ping().Build()).Error())
}
