// Package valkeystore is the fencing.Store kept in Valkey (or a Redis 7
// compatible server), single node or cluster, shared by many gates.
//
// Every operation is one Lua script (lua/*.lua, each with a KEYS/ARGV/returns
// contract), run with EVALSHA and reloaded automatically after SCRIPT FLUSH
// or a server restart. Expiry is judged by the server's TIME inside the
// scripts, never by the gate's clock. Tokens are decimal strings inside Lua.
// One exception, in AdmitBatch (batch.go) and the mark readers
// (markreader.go): an admission that needs no live lease is first answered
// from one read of its record's marks when its token is at the high-water
// mark, which is admit.lua's answer at that instant, without a script.
//
// Keys, for resource R under the key prefix P (default "fencegate"), are
// hash-tagged so that each script touches one cluster slot:
//
//	P:{R}        hash: issued and high-water tokens, floor, the highest
//	             high-water mark confirmed on replicas (see wait.go), the most recent
//	             lease, how the one before it ended, checkpoint metadata.
//	             Never expires and is never deleted.
//	P:{R}:state  the last checkpoint state.
//	P:{R}:live   the live lease's token, expiring with the lease; the index
//	             List scans.
//
// A checkpoint exists when the record has checkpoint metadata and P:{R}:state
// holds a state. Metadata whose state key is gone (deleted outside
// fencegate) reads as no checkpoint: ReadCheckpoint answers
// fencing.ErrNoCheckpoint and Status has no Checkpoint. ReadCheckpoint never
// returns a state that is not valid JSON (a state key overwritten outside
// fencegate with something else is an internal error).
//
// In a cluster, Ping, List and Open judge the cluster by its primaries, the
// nodes every operation runs on: a dead replica fails none of them, a dead
// primary fails Ping and List with a store fault (fencing.IsStoreFault)
// until a replica is promoted and the client has learnt it (it re-reads the
// slot map every 15 seconds, and after a connection error).
//
// Tokens follow the server clock: a new token is max(issued+1, the server's
// TIME in microseconds). Tokens stay below 2^53 (exact as JSON numbers) until
// the year 2255. When the store loses writes:
//
//   - A record lost whole (restart without persistence, FLUSHALL, failover
//     to an empty replica) is re-created with a floor above the server
//     clock and above every token this gate has seen on any resource
//     (seen.go): every token issued before the loss is refused, and the next
//     token is above it, even when the serving node's clock is behind the
//     lost tokens, as long as this gate saw them (or a later token).
//   - A gate notices a record that is not the one it last saw (an issued
//     counter that went back, or another floor: rolled back by a failover
//     to a lagging replica or a crash losing the last second of an
//     appendfsync everysec AOF; or lost and re-created through another gate)
//     on its next admission for that resource: it lifts the record past
//     every token it has seen and answers fencing.ErrStoreLost; the lift
//     then holds for every gate.
//   - Limits: a gate's memory is per process, bounded, and starts empty. A
//     gate that never saw a resource before the loss relies on the clocks:
//     a pre-loss token issued by a node whose clock was ahead of the
//     post-loss node's can be admitted through it once the post-loss
//     counter passes that token, unless a gate that saw the resource lifted
//     it first. A rollback that only lost a high-water mark raise (no
//     token issued since) is noticed only through its floor or counter, so
//     a token superseded in the lost window may be admitted again, until a
//     newer token is admitted; Options.WaitReplicas prevents that for
//     failovers (see wait.go).
//
// Faults are classified here: a request that never left the client
// (connection refused, dial failure, client closed, server LOADING/BUSY)
// matches fencing.ErrUnavailable; one that may have reached the server
// (timeout or broken connection after sending) matches fencing.ErrAmbiguous.
// Only read-only scripts are retried by the client; scripts that write are
// sent once, so that ErrUnavailable always means "not performed".
package valkeystore

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/valkey-io/valkey-go"
)

// Defaults for Options.
const (
	// DefaultKeyPrefix starts every key when Options.KeyPrefix is empty.
	DefaultKeyPrefix = "fencegate"
	// DefaultDialTimeout bounds a connection attempt.
	DefaultDialTimeout = 5 * time.Second
	// DefaultCommandTimeout bounds one operation (one script).
	DefaultCommandTimeout = 2 * time.Second
	// DefaultWaitTimeout bounds the WAIT for replicas when
	// Options.WaitReplicas > 0 and Options.WaitTimeout is 0.
	DefaultWaitTimeout = time.Second
)

// Options configure Open.
type Options struct {
	// URL is valkey://[user:pass@]host:port[/db][?addr=host2:port2&...],
	// or valkeys://... for TLS (redis:// and rediss:// are accepted too).
	// Several addresses (the host and addr= parameters) are seeds of a
	// Valkey Cluster; a single address is probed and used as a cluster
	// when it is one.
	URL string
	// KeyPrefix starts every key; default DefaultKeyPrefix. It may
	// contain only A-Z a-z 0-9 . _ : -, so that it never forms a hash tag
	// or a SCAN pattern.
	KeyPrefix string
	// MaxCheckpointBytes limits checkpoint state; 0 means
	// fencing.DefaultMaxCheckpointBytes.
	MaxCheckpointBytes int
	// Logger receives start-up warnings; nil discards them.
	Logger *slog.Logger
	// DialTimeout bounds each connection attempt; 0 means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// CommandTimeout bounds each operation (a call's own context may end
	// it sooner); 0 means DefaultCommandTimeout. An operation that times
	// out after sending matches fencing.ErrAmbiguous.
	CommandTimeout time.Duration
	// TLSConfig overrides the TLS settings of a valkeys:// URL (CA,
	// client certificate); ignored for valkey://.
	TLSConfig *tls.Config
	// WaitReplicas, when > 0, makes Admit confirm with WAIT that the
	// high-water mark a successful admission relies on has reached at
	// least this many replicas of the resource's primary, so that a
	// failover to one of them cannot roll the mark back. An admission whose
	// mark cannot be confirmed within WaitTimeout fails with
	// fencing.ErrAmbiguous (the mark stays raised on the primary; the gate
	// forwards nothing). Only admissions that raise the mark, or rely on a
	// mark not yet confirmed, wait: one round trip plus the replicas'
	// acknowledgement. 0 (the default) never waits. Must not be negative.
	// See wait.go for the design and its limits.
	WaitReplicas int
	// WaitTimeout bounds each WAIT for replicas (on top of CommandTimeout);
	// 0 means DefaultWaitTimeout. Used only when WaitReplicas > 0. Must not
	// be negative.
	WaitTimeout time.Duration
	// PolicyCheckInterval is how often every node's maxmemory-policy and
	// persistence are checked again after Open (see health.go); 0 means
	// DefaultPolicyCheckInterval. Must not be negative.
	PolicyCheckInterval time.Duration
}

// Store is the Valkey fencing.Store. Safe for concurrent use: calls share
// valkey-go's auto-pipelined connections.
type Store struct {
	client     valkey.Client
	prefix     string
	maxState   int
	cmdTimeout time.Duration
	log        *slog.Logger
	closed     atomic.Bool

	waitReplicas int           // Options.WaitReplicas
	shared       subscriptions // the shared barrier's wake-ups (barrier.go)
	waitTimeout  time.Duration // Options.WaitTimeout

	seen *seenMarks // what the server answered: see seen.go

	markReaders *markReaderOption // nil: none (markreader.go)

	// policyFault is the last eviction-policy check's fault, "" or nil
	// when none (see health.go).
	policyFault atomic.Pointer[string]
	stopWatch   chan struct{} // closed by Close
	watchDone   chan struct{} // closed when the policy watcher returns
}

var _ fencing.Store = (*Store)(nil)

// Open connects, pings, and checks every server node: maxmemory-policy must
// be noeviction (Open refuses otherwise: an evicting server may drop token
// counters and high-water marks), and a warning is logged when neither AOF
// nor RDB snapshots are on. In a cluster every primary must answer; a
// replica that does not answer is skipped with a warning (it is checked by
// the next Open that reaches it). Connection failures match
// fencing.ErrUnavailable.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = DefaultKeyPrefix
	}
	if err := ValidateKeyPrefix(opts.KeyPrefix); err != nil {
		return nil, err
	}
	if opts.MaxCheckpointBytes == 0 {
		opts.MaxCheckpointBytes = fencing.DefaultMaxCheckpointBytes
	}
	if opts.MaxCheckpointBytes < 0 {
		return nil, errors.New("valkeystore: MaxCheckpointBytes must not be negative")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.CommandTimeout <= 0 {
		opts.CommandTimeout = DefaultCommandTimeout
	}
	if opts.WaitReplicas < 0 {
		return nil, errors.New("valkeystore: WaitReplicas must not be negative")
	}
	if opts.WaitTimeout < 0 {
		return nil, errors.New("valkeystore: WaitTimeout must not be negative")
	}
	if opts.WaitTimeout == 0 {
		opts.WaitTimeout = DefaultWaitTimeout
	}
	if opts.PolicyCheckInterval < 0 {
		return nil, errors.New("valkeystore: PolicyCheckInterval must not be negative")
	}
	if opts.PolicyCheckInterval == 0 {
		opts.PolicyCheckInterval = DefaultPolicyCheckInterval
	}
	copt, err := clientOption(opts)
	if err != nil {
		return nil, err
	}
	client, err := valkey.NewClient(copt)
	if err != nil {
		return nil, fmt.Errorf("valkeystore: connect to %s: %w", strings.Join(copt.InitAddress, ","), classify("connect", err))
	}
	s := &Store{client: client, prefix: opts.KeyPrefix, maxState: opts.MaxCheckpointBytes, cmdTimeout: opts.CommandTimeout, log: opts.Logger,
		waitReplicas: opts.WaitReplicas, waitTimeout: opts.WaitTimeout, seen: newSeenMarks(),
		markReaders: newMarkReaderOption(copt, client.Mode(), opts.WaitReplicas)}
	if err := s.Ping(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("valkeystore: ping: %w", err)
	}
	if err := s.checkNodes(ctx); err != nil {
		client.Close()
		return nil, err
	}
	if s.waitReplicas > 0 {
		s.warnFewReplicas(ctx)
	}
	s.stopWatch, s.watchDone = make(chan struct{}), make(chan struct{})
	go s.watchPolicy(opts.PolicyCheckInterval)
	return s, nil
}

// clientOption maps Options to valkey-go's, without leaking the password
// into errors.
func clientOption(opts Options) (valkey.ClientOption, error) {
	u, err := url.Parse(opts.URL)
	if err != nil {
		return valkey.ClientOption{}, errors.New("valkeystore: the store URL is not a valid URL")
	}
	switch u.Scheme {
	case "valkey", "redis", "valkeys", "rediss":
	default:
		return valkey.ClientOption{}, fmt.Errorf("valkeystore: store URL scheme %q: want valkey:// or valkeys://", u.Scheme)
	}
	if u.Host == "" {
		return valkey.ClientOption{}, errors.New("valkeystore: the store URL has no host")
	}
	copt, err := valkey.ParseURL(opts.URL)
	if err != nil {
		// ParseURL's errors name only the scheme, db or a parameter.
		return valkey.ClientOption{}, fmt.Errorf("valkeystore: store URL: %w", err)
	}
	if copt.TLSConfig != nil && opts.TLSConfig != nil {
		tc := opts.TLSConfig.Clone()
		if tc.ServerName == "" {
			tc.ServerName = copt.TLSConfig.ServerName
		}
		copt.TLSConfig = tc
	}
	copt.Dialer.Timeout = opts.DialTimeout
	// A connection that stops answering is closed after this long; the
	// operation's own deadline (CommandTimeout) usually ends it first.
	copt.ConnWriteTimeout = max(opts.CommandTimeout, time.Second)
	copt.DisableCache = true // no client-side caching: every read is from the server
	// In a cluster, re-read the slot map periodically too, not only after a
	// command failed: so the client forgets failed replicas and learns
	// promoted ones (ignored by a single-node client).
	copt.ClusterOption.ShardsRefreshInterval = topologyRefresh
	if copt.ClientName == "" {
		copt.ClientName = "fencegate"
	}
	return copt, nil
}

// ValidateKeyPrefix checks a key prefix: 1 to 100 bytes of
// A-Z a-z 0-9 . _ : -, so that it never forms a hash tag or a SCAN pattern.
func ValidateKeyPrefix(p string) error {
	if p == "" {
		return errors.New("valkeystore: KeyPrefix must not be empty")
	}
	if len(p) > 100 {
		return errors.New("valkeystore: KeyPrefix must be at most 100 bytes")
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return fmt.Errorf("valkeystore: KeyPrefix %q may contain only A-Z a-z 0-9 . _ : -", p)
		}
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

// Keys of a resource; see the package doc.
func (s *Store) recKey(res string) string   { return s.prefix + ":{" + res + "}" }
func (s *Store) liveKey(res string) string  { return s.prefix + ":{" + res + "}:live" }
func (s *Store) stateKey(res string) string { return s.prefix + ":{" + res + "}:state" }

// run executes one script with the command timeout and returns its array
// reply, classifying faults.
func (s *Store) run(ctx context.Context, op string, sc *valkey.Lua, keys, args []string) ([]string, error) {
	if err := s.checkOpen(op); err != nil {
		return nil, err
	}
	if err := s.checkPolicy(op); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cmdTimeout)
	defer cancel()
	return scriptReply(op, sc.Exec(ctx, s.client, keys, args))
}

// checkOpen fails a call on a closed store (nothing is sent) with
// fencing.ErrUnavailable.
func (s *Store) checkOpen(op string) error {
	if s.closed.Load() {
		return fmt.Errorf("%w: %s: the store is closed", fencing.ErrUnavailable, op)
	}
	return nil
}

// scriptReply decodes a script's array reply, classifying faults.
func scriptReply(op string, res valkey.ValkeyResult) ([]string, error) {
	out, err := res.AsStrSlice()
	if err != nil {
		if errors.Is(err, valkey.ErrClosing) {
			// The store was open when the call started, so Close ran
			// during it: the script may have been sent and run.
			return nil, fmt.Errorf("%w: %s: the store was closed during the call", fencing.ErrAmbiguous, op)
		}
		return nil, classify(op, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s: empty script reply", fencing.ErrAmbiguous, op)
	}
	return out, nil
}

// corrupt reports a reply the scripts never produce. The script ran, so the
// outcome is unknown to the caller.
func corrupt(op string, reply []string) error {
	return fmt.Errorf("%w: %s: unexpected script reply %q", fencing.ErrAmbiguous, op, reply)
}

func parseToken(s string) (fencing.Token, bool) {
	if s == "" {
		return 0, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return fencing.Token(v), err == nil
}

func parseMillis(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// lease parses {token, ttl_ms, acquired_ms, expires_ms}.
func lease(res, owner string, f []string) (fencing.Lease, bool) {
	if len(f) != 4 {
		return fencing.Lease{}, false
	}
	tok, ok1 := parseToken(f[0])
	ttl, ok2 := parseMillis(f[1])
	acq, ok3 := parseMillis(f[2])
	exp, ok4 := parseMillis(f[3])
	if !ok1 || !ok2 || !ok3 || !ok4 || tok == 0 {
		return fencing.Lease{}, false
	}
	return fencing.Lease{Resource: res, Owner: owner, Token: tok, TTL: time.Duration(ttl) * time.Millisecond,
		AcquiredAt: fromMillis(acq), ExpiresAt: fromMillis(exp)}, true
}

func leaseLost(res string) error {
	return fmt.Errorf("%w: the caller does not hold the live lease on %q", fencing.ErrLeaseLost, res)
}

// Acquire implements fencing.Store. It is never retried: a fault after
// sending matches fencing.ErrAmbiguous, and the caller may acquire again as
// the same owner (which extends the lease it may have got).
func (s *Store) Acquire(ctx context.Context, req fencing.AcquireRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	seen, known := s.seen.resource(req.Resource)
	hint := max(s.seen.floor(), seen.issued)
	seenFloor := ""
	if known {
		seenFloor = seen.floor.String()
	}
	r, err := s.run(ctx, "acquire", acquireScript, []string{s.recKey(req.Resource), s.liveKey(req.Resource)},
		[]string{req.Owner, strconv.FormatInt(req.TTL.Milliseconds(), 10), hint.String(), seen.issued.String(), seenFloor})
	if err != nil {
		return fencing.Lease{}, err
	}
	switch {
	case r[0] == "OK" && len(r) == 6:
		l, ok1 := lease(req.Resource, req.Owner, r[1:5])
		floor, ok2 := parseToken(r[5])
		if ok1 && ok2 {
			s.seen.observe(req.Resource, l.Token, floor)
			return l, nil
		}
	case r[0] == "HELD" && len(r) == 4:
		exp, ok1 := parseMillis(r[2])
		now, ok2 := parseMillis(r[3])
		if ok1 && ok2 {
			return fencing.Lease{}, &fencing.LeaseHeldError{Resource: req.Resource, Holder: r[1], ExpiresAt: fromMillis(exp), Now: fromMillis(now)}
		}
	}
	return fencing.Lease{}, corrupt("acquire", r)
}

// Renew implements fencing.Store.
func (s *Store) Renew(ctx context.Context, req fencing.RenewRequest) (fencing.Lease, error) {
	if err := req.Validate(); err != nil {
		return fencing.Lease{}, err
	}
	ttl := ""
	if req.TTL != 0 {
		ttl = strconv.FormatInt(req.TTL.Milliseconds(), 10)
	}
	r, err := s.run(ctx, "renew", renewScript, []string{s.recKey(req.Resource), s.liveKey(req.Resource)},
		[]string{req.Owner, req.Token.String(), ttl})
	if err != nil {
		return fencing.Lease{}, err
	}
	return leaseReply("renew", req.Resource, req.Owner, r)
}

// leaseReply decodes the reply of renew.lua and checkpoint.lua.
func leaseReply(op, res, owner string, r []string) (fencing.Lease, error) {
	switch r[0] {
	case "OK":
		if l, ok := lease(res, owner, r[1:]); ok {
			return l, nil
		}
	case "LOST":
		return fencing.Lease{}, leaseLost(res)
	}
	return fencing.Lease{}, corrupt(op, r)
}

// Release implements fencing.Store. It is never retried (a retry after a
// lost reply would answer false).
func (s *Store) Release(ctx context.Context, req fencing.ReleaseRequest) (bool, error) {
	if err := req.Validate(); err != nil {
		return false, err
	}
	fin := "0"
	if req.Finished {
		fin = "1"
	}
	r, err := s.run(ctx, "release", releaseScript, []string{s.recKey(req.Resource), s.liveKey(req.Resource)},
		[]string{req.Owner, req.Token.String(), fin})
	if err != nil {
		return false, err
	}
	switch {
	case r[0] == "OK" && len(r) == 2:
		return r[1] == "1", nil
	case r[0] == "LOST":
		return false, leaseLost(req.Resource)
	}
	return false, corrupt("release", r)
}

// Checkpoint implements fencing.Store.
func (s *Store) Checkpoint(ctx context.Context, req fencing.CheckpointRequest) (fencing.Lease, error) {
	if err := req.Validate(s.maxState); err != nil {
		return fencing.Lease{}, err
	}
	r, err := s.run(ctx, "checkpoint", checkpointScript,
		[]string{s.recKey(req.Resource), s.liveKey(req.Resource), s.stateKey(req.Resource)},
		[]string{req.Owner, req.Token.String(), string(req.State)})
	if err != nil {
		return fencing.Lease{}, err
	}
	return leaseReply("checkpoint", req.Resource, req.Owner, r)
}

// record is a resource's record as read by status.lua and
// readcheckpoint.lua.
type record struct {
	now       int64
	issued    fencing.Token
	highWater fencing.Token
	live      *fencing.Lease
	previous  *fencing.Previous
	saved     *fencing.CheckpointInfo
}

// parseRecord reads the 17 fields of status.lua.
func parseRecord(res string, f []string) (record, bool) {
	if len(f) < 17 {
		return record{}, false
	}
	var r record
	var ok bool
	if r.now, ok = parseMillis(f[0]); !ok {
		return r, false
	}
	if r.issued, ok = parseToken(f[1]); !ok {
		return r, false
	}
	if r.highWater, ok = parseToken(f[2]); !ok {
		return r, false
	}
	owner, rel, fin := f[3], f[8], f[9]
	if owner != "" {
		l, ok := lease(res, owner, f[4:8])
		if !ok {
			return r, false
		}
		if rel != "1" && r.now < l.ExpiresAt.UnixMilli() {
			r.live = &l
		} else {
			ended := fencing.EndExpired
			if rel == "1" {
				ended = fencing.EndReleased
			}
			r.previous = &fencing.Previous{Owner: owner, Token: l.Token, Ended: ended, Finished: fin == "1"}
		}
	}
	if r.previous == nil && f[10] != "" {
		tok, ok := parseToken(f[11])
		if !ok {
			return r, false
		}
		r.previous = &fencing.Previous{Owner: f[10], Token: tok, Ended: fencing.Ending(f[12]), Finished: f[13] == "1"}
	}
	if f[14] != "" {
		tok, ok1 := parseToken(f[14])
		ms, ok2 := parseMillis(f[15])
		size, err := strconv.Atoi(f[16])
		if !ok1 || !ok2 || err != nil {
			return r, false
		}
		r.saved = &fencing.CheckpointInfo{Token: tok, UpdatedAt: fromMillis(ms), SizeBytes: size}
	}
	return r, true
}

// ReadCheckpoint implements fencing.Store. A checkpoint exists when the
// record has checkpoint metadata and the state key P:{R}:state holds a
// non-empty string; metadata whose state is gone (the key was deleted
// outside fencegate) reads as no checkpoint, here and in Status, so a
// caller never receives an empty state. A state that is not valid JSON
// (only possible when the key was overwritten outside fencegate) is an
// error that matches no fencing sentinel: an internal error, not a
// checkpoint.
func (s *Store) ReadCheckpoint(ctx context.Context, resource string) (fencing.Checkpoint, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Checkpoint{}, err
	}
	f, err := s.run(ctx, "read checkpoint", readCheckpointScript, []string{s.recKey(resource), s.stateKey(resource)}, nil)
	if err != nil {
		return fencing.Checkpoint{}, err
	}
	r, ok := parseRecord(resource, f)
	if !ok || len(f) != 18 {
		return fencing.Checkpoint{}, corrupt("read checkpoint", f)
	}
	if r.saved == nil {
		return fencing.Checkpoint{}, fmt.Errorf("%w for %q", fencing.ErrNoCheckpoint, resource)
	}
	state := []byte(f[17])
	if !json.Valid(state) {
		return fencing.Checkpoint{}, fmt.Errorf("valkeystore: the checkpoint state of %q is not valid JSON (its key was changed outside fencegate)", resource)
	}
	return fencing.Checkpoint{State: state, Token: r.saved.Token, UpdatedAt: r.saved.UpdatedAt, Previous: r.previous}, nil
}

// Status implements fencing.Store.
func (s *Store) Status(ctx context.Context, resource string) (fencing.Status, error) {
	if err := fencing.ValidateResource(resource); err != nil {
		return fencing.Status{}, err
	}
	f, err := s.run(ctx, "status", statusScript, []string{s.recKey(resource), s.stateKey(resource)}, nil)
	if err != nil {
		return fencing.Status{}, err
	}
	r, ok := parseRecord(resource, f)
	if !ok {
		return fencing.Status{}, corrupt("status", f)
	}
	return fencing.Status{Resource: resource, Issued: r.issued, HighWater: r.highWater, Lease: r.live, Previous: r.previous, Checkpoint: r.saved}, nil
}

// Admit implements fencing.Store. The check and the raise of the high-water
// mark are one script. It is idempotent, so a caller may retry it after
// fencing.ErrAmbiguous with the same token.
//
// With Options.WaitReplicas > 0, an admission succeeds only once the mark
// it relies on is confirmed on that many replicas (see wait.go): an
// admission at an already confirmed mark costs one script, as without it;
// one that raises the mark (or relies on an unconfirmed one) also waits
// for the replicas, up to Options.WaitTimeout, and fails with
// fencing.ErrAmbiguous when they do not confirm.
func (s *Store) Admit(ctx context.Context, req fencing.AdmitRequest) (fencing.Admission, error) {
	if err := req.Validate(); err != nil {
		return fencing.Admission{}, err
	}
	live := "0"
	if req.RequireLive {
		live = "1"
	}
	args := []string{req.Token.String(), live}
	before, known := s.seen.resource(req.Resource)
	top := s.seen.floor()
	if s.waitReplicas > 0 {
		args = append(args, "1") // probe: see wait.go
	}
	r, err := s.run(ctx, "admit", admitScript, []string{s.recKey(req.Resource)}, args)
	if err != nil {
		return fencing.Admission{}, err
	}
	if r[0] == "WAIT" && len(r) == 1 && s.waitReplicas > 0 {
		if r, err = s.admitWaiting(ctx, req, live); err != nil {
			return fencing.Admission{}, err
		}
	}
	return s.admitReply(ctx, req, r, top, before, known)
}

// admitReply decodes admit.lua's reply (shared with the shared barrier's
// admit_register.lua) and checks it against what this Store had seen
// before sending the call (top, before, known: see checkNotLost).
func (s *Store) admitReply(ctx context.Context, req fencing.AdmitRequest, r []string, top fencing.Token, before seenRecord, known bool) (fencing.Admission, error) {
	switch {
	case r[0] == "OK" && (len(r) == 5 || len(r) == 6 && s.waitReplicas > 0):
		issued, ok1 := parseToken(r[1])
		hw, ok2 := parseToken(r[2])
		floor, ok3 := parseToken(r[len(r)-1])
		if ok1 && ok2 && ok3 {
			if err := s.checkNotLost(ctx, req.Resource, top, before, known, issued, floor); err != nil {
				return fencing.Admission{}, err
			}
			return fencing.Admission{Resource: req.Resource, Token: req.Token, HighWater: hw, Issued: issued, Raised: r[3] == "1"}, nil
		}
	case r[0] == "NOTISSUED" && len(r) == 3:
		issued, ok1 := parseToken(r[1])
		floor, ok2 := parseToken(r[2])
		if ok1 && ok2 {
			if err := s.checkNotLost(ctx, req.Resource, top, before, known, issued, floor); err != nil {
				return fencing.Admission{}, err
			}
			return fencing.Admission{}, &fencing.TokenNotIssuedError{Resource: req.Resource, Token: req.Token, Issued: issued}
		}
	case r[0] == "STALE" && len(r) == 2:
		if hw, ok := parseToken(r[1]); ok {
			return fencing.Admission{}, &fencing.StaleTokenError{Resource: req.Resource, Token: req.Token, HighWater: hw}
		}
	case r[0] == "FLOOR" && len(r) == 2:
		if next, ok := parseToken(r[1]); ok {
			return fencing.Admission{}, &fencing.StaleTokenError{Resource: req.Resource, Token: req.Token, HighWater: next, BeforeLoss: true}
		}
	case r[0] == "NOTHELD":
		return fencing.Admission{}, fmt.Errorf("%w: no live lease on %q holds token %d", fencing.ErrLeaseNotHeld, req.Resource, req.Token)
	}
	return fencing.Admission{}, corrupt("admit", r)
}

// checkNotLost compares a resource's issued counter and floor as the server
// answered them with what this Store had seen before sending the call
// (seen, known; top, the highest token seen on any resource; see seen.go).
// An issued counter below the one seen, or another floor, means the record
// lost writes or was created afresh: it is lifted past every token this
// Store had seen (not past tokens issued since the call was sent, which
// are post-loss) and the call fails with fencing.ErrStoreLost. Otherwise
// the answer is remembered.
func (s *Store) checkNotLost(ctx context.Context, res string, top fencing.Token, seen seenRecord, known bool, issued, floor fencing.Token) error {
	if !seen.lost(known, issued, floor) {
		s.seen.observe(res, issued, floor)
		return nil
	}
	to := max(top, seen.issued)
	s.log.Error("valkeystore: the store lost data: a resource's record is older than one this gate saw; moving it past every token this gate has seen",
		"resource", res, "issued", issued, "floor", floor, "seen_issued", seen.issued, "seen_floor", seen.floor, "lift_to", to)
	lost := fmt.Errorf("%w: %q: the record (issued %d, floor %d) is not the one seen before (issued %d, floor %d)",
		fencing.ErrStoreLost, res, issued, floor, seen.issued, seen.floor)
	r, err := s.run(ctx, "lift", liftScript, []string{s.recKey(res), s.liveKey(res)}, []string{to.String()})
	if err != nil {
		return fmt.Errorf("%w; lifting it failed: %w", lost, err)
	}
	if r[0] != "OK" || len(r) != 3 {
		return fmt.Errorf("%w; lift: %w", lost, corrupt("lift", r))
	}
	newIssued, ok1 := parseToken(r[1])
	newFloor, ok2 := parseToken(r[2])
	if !ok1 || !ok2 {
		return fmt.Errorf("%w; lift: %w", lost, corrupt("lift", r))
	}
	s.seen.observe(res, newIssued, newFloor)
	return fmt.Errorf("%w; it now refuses every token up to %d", lost, newFloor)
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

// Close implements fencing.Store. Calls after Close match
// fencing.ErrUnavailable. Close is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.stopWatch != nil {
		close(s.stopWatch)
		<-s.watchDone
	}
	s.client.Close()
	return nil
}
