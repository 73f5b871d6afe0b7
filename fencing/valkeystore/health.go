package valkeystore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/valkey-io/valkey-go"
)

// DefaultPolicyCheckInterval is how often a Store re-checks every node's
// maxmemory-policy and persistence (and, on a single node, its replication
// role) when Options.PolicyCheckInterval is 0.
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

// The node's role, on a single node (not a cluster).
//
// The configured address must be the primary. A replica answers reads from
// its copy of the data, which may be behind the primary's (replication lag,
// a broken link): an admission at its copy of a high-water mark (admit.lua
// writes nothing then, so a read-only replica runs it; AdmitBatch's and the
// mark readers' HMGET) could admit a token the primary has already
// superseded, and every raise fails READONLY. So Open refuses a node whose
// role (INFO replication) is not master, and the periodic check reads the
// role too: while the node is not a primary (a replica named by mistake, the
// old primary demoted by REPLICAOF after a failover), Ping fails and every
// operation fails closed with fencing.ErrUnavailable, nothing sent (Admit,
// AdmitBatch and the mark readers included), until a check finds it master
// again. A READONLY reply to any command sets that fault at once (the call
// itself is reported not performed), without waiting for the next check.
// The fault is logged once when it appears and once when it is gone.
//
// Limits: a demotion is seen at the next check (every PolicyCheckInterval)
// or at the first READONLY reply, whichever comes first; admissions at the
// mark in between are answered by the demoted node. In a cluster the client
// follows the slot map to each slot's primary (a demoted node answers MOVED)
// and replicas are expected: roles are not checked there.

// policyState is the result of one check: the eviction fault ("" when every
// node that answered has noeviction), the role fault ("" when the node is a
// primary, or in a cluster) and each node's persistence summary.
type policyState struct {
	fault       string
	role        string
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
	role := s.roleFault.Load() // before asking: a READONLY reply meanwhile wins (see publishRole)
	var bad, notPrimary []string
	for addr, node := range s.client.Nodes() {
		if !s.isCluster() {
			if f, ok := s.checkRole(ctx, addr, node); !ok {
				// Unreachable: keep the fault the node had.
				if role != nil && *role != "" {
					notPrimary = append(notPrimary, *role)
				}
			} else if f != "" {
				notPrimary = append(notPrimary, f)
			}
		}
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
	slices.Sort(notPrimary)
	now.role = strings.Join(slices.Compact(notPrimary), "; ")
	s.publishRole(role, now.role)
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

// checkRole reads a node's replication role: fault is "" when it is a
// primary (role master), else why it is refused; ok is false when the node
// did not answer.
func (s *Store) checkRole(ctx context.Context, addr string, node valkey.Client) (fault string, ok bool) {
	info, err := node.Do(ctx, node.B().Info().Section("replication").Build()).ToString()
	if err != nil {
		return "", false
	}
	return roleFault(addr, infoField(info, "role")), true
}

// roleFault is why a node of role role (INFO replication) is refused, ""
// for a primary.
func roleFault(addr, role string) string {
	if role == "master" {
		return ""
	}
	switch role {
	case "slave":
		role = "a replica"
	case "":
		role = "of no known role (INFO replication names none)"
	default:
		role = fmt.Sprintf("of role %q", role)
	}
	return fmt.Sprintf("server %s is %s, not the primary", addr, role)
}

// publishRole replaces the role fault old (as loaded before the check)
// with now, and logs when a fault appears or goes. When the fault changed
// meanwhile (a READONLY reply set it during the check), the check's answer
// is dropped: the next check judges again.
func (s *Store) publishRole(old *string, now string) {
	was := ""
	if old != nil {
		was = *old
	}
	if was == now || !s.roleFault.CompareAndSwap(old, &now) {
		return
	}
	switch {
	case was == "":
		s.log.Error("valkeystore: the server is not the primary: every operation is refused and /readyz is red until it is the primary again; "+
			"the store URL must name the primary", "fault", now)
	case now == "":
		s.log.Info("valkeystore: the server is the primary again; operations resume")
	}
}

// noteReadOnly sets the role fault at once when err is a READONLY reply
// (the node is a read-only replica) on a single node, so that the next
// calls fail closed without waiting for the next check, which clears it
// once the node is the primary again. In a cluster it does nothing (the
// client follows the slot map).
func (s *Store) noteReadOnly(err error) {
	verr, ok := valkey.IsValkeyErr(err)
	if !ok || !strings.HasPrefix(verr.Error(), "READONLY") || s.isCluster() {
		return
	}
	for {
		old := s.roleFault.Load()
		if old != nil && *old != "" {
			return
		}
		addrs := slices.Sorted(maps.Keys(s.client.Nodes()))
		f := fmt.Sprintf("server %s answered READONLY: it is a read-only replica, not the primary", strings.Join(addrs, ","))
		if s.roleFault.CompareAndSwap(old, &f) {
			s.log.Error("valkeystore: the server is not the primary: every operation is refused and /readyz is red until it is the primary again; "+
				"the store URL must name the primary", "fault", f)
			return
		}
	}
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
// an evicting node, or while the node is not the primary (the last check,
// or a READONLY reply since); nothing is sent then.
func (s *Store) checkPolicy(op string) error {
	if f := s.policyFault.Load(); f != nil && *f != "" {
		return fmt.Errorf("%w: %s: %s; fencegate requires noeviction", fencing.ErrUnavailable, op, *f)
	}
	if f := s.roleFault.Load(); f != nil && *f != "" {
		return fmt.Errorf("%w: %s: %s; fencegate needs the primary", fencing.ErrUnavailable, op, *f)
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
	if !s.isCluster() {
		repl, err := node.Do(ctx, node.B().Info().Section("replication").Build()).ToString()
		if err != nil {
			return true, fmt.Errorf("valkeystore: INFO replication on %s: %w", addr, classify("check", err))
		}
		if f := roleFault(addr, infoField(repl, "role")); f != "" {
			return true, fmt.Errorf("valkeystore: %w: %s; fencegate needs the primary: "+
				"a replica (or a primary demoted by REPLICAOF after a failover) answers from a copy that may be behind, "+
				"so a superseded token could be admitted; give the primary's address in the store URL", fencing.ErrUnavailable, f)
		}
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
