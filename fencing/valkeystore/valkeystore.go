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
//	             Without Options.Retention it never expires; with it, it
//	             expires that long after its last change or the end of
//	             its live lease, whichever is later (see retention.go).
//	P:{R}:state  the last checkpoint state, expiring with the record.
//	P:{R}:live   the live lease's token, expiring with the lease; the index
//	             List scans.
//	P:{R}:bar    the shared barrier's entries (see barrier.go), expiring
//	             with the last one; a record with retention outlives them.
//
// Every script receives each key it reads or writes in KEYS and builds no
// key name itself, as Valkey and Redis Cluster (and their proxies) require;
// the names above are computed once, in Go (scripts.go, leaseKeys and
// admitKeys).
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
//     counter or a high-water mark that went back under the same floor,
//     the mark alone when only a raise was lost: rolled back by a
//     failover to a lagging replica or a crash losing the last second of an
//     appendfsync everysec AOF; or another floor below a token it saw on
//     the resource: lost and re-created through another gate whose clock
//     is behind) on its next admission for that resource: it lifts the
//     record past every token it has seen and answers
//     fencing.ErrStoreLost; the lift then holds for every gate. A record
//     that is gone, or re-created with a floor at or above every token the
//     gate saw on it, is not a loss: retention removes records
//     (retention.go), and the server's clock or the new floor refuses every
//     token issued before.
//   - Limits: a gate's memory is per process, bounded, and starts empty. A
//     gate that never saw a resource before the loss relies on the clocks:
//     a pre-loss token issued by a node whose clock was ahead of the
//     post-loss node's can be admitted through it once the post-loss
//     counter passes that token, unless a gate that saw the resource lifted
//     it first. A rollback that only lost a high-water mark raise is
//     noticed by the gates that saw the raise (or a later mark); through
//     another gate a token superseded in the lost window may be admitted
//     again, until a newer token is admitted; Options.WaitReplicas
//     prevents that for failovers (see wait.go).
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
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
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
	// when it is one. The query takes addr (host:port, repeatable),
	// client_name and, on valkeys://, skip_verify; any other parameter
	// is refused (see checkURLQuery), so a misspelt one is never ignored.
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
	// Retention (FENCEGATE_RETENTION; DESIGN §12) makes the server remove a
	// resource's record and checkpoint by key expiry once they have no live
	// lease and have been untouched (acquire, renew, release, checkpoint,
	// an admission) for this long: every script that writes sets the keys'
	// TTL to the retention past the later of now and the live lease's end
	// (lua/lib.lua, fg_keep). 0 (the default) keeps records for ever, and
	// removes a TTL an earlier retention left on a record the next time it
	// is written. Must not be negative. The server counts what it removes
	// (INFO stats: expired_keys), not the store.
	Retention time.Duration
	// PolicyCheckInterval is how often every node's maxmemory-policy and
	// persistence, and on a single node its role (it must be the primary),
	// are checked again after Open (see health.go); 0 means
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
	// instance is random, drawn at Open: it sets this store's shared-barrier
	// entries apart from those of another gate given the same gate id
	// (see AdmitRegister).
	instance string

	retention string        // Options.Retention in ms, as the scripts take it
	slack     time.Duration // how stale a record's TTL may get before an admission rewrites it (keepSlack)

	markReaders *markReaderOption // nil: none (markreader.go)

	// policyFault is the last eviction-policy check's fault, "" or nil
	// when none (see health.go).
	policyFault atomic.Pointer[string]
	// roleFault says why the node is not used as the primary, "" or nil
	// when it is (see health.go; never set in a cluster).
	roleFault atomic.Pointer[string]
	stopWatch chan struct{} // closed by Close
	watchDone chan struct{} // closed when the policy watcher returns
}

// Open connects, pings, and checks every server node: maxmemory-policy must
// be noeviction (Open refuses otherwise: an evicting server may drop token
// counters and high-water marks), on a single node (not a cluster) its role
// must be master (Open refuses a replica with fencing.ErrUnavailable: see
// health.go), and a warning is logged when neither AOF nor RDB snapshots
// are on. In a cluster every primary must answer; a
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
	if opts.Retention < 0 {
		return nil, errors.New("valkeystore: Retention must not be negative")
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
		markReaders: newMarkReaderOption(copt, client.Mode(), opts.WaitReplicas),
		retention:   strconv.FormatInt(keptFor(opts.Retention).Milliseconds(), 10), slack: keepSlack(keptFor(opts.Retention)),
		instance: strconv.FormatUint(rand.Uint64(), 36)}
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
	if err := checkURLQuery(u); err != nil {
		return valkey.ClientOption{}, err
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
	// valkey-go gives each connection a read and a write buffer of 0.5
	// MiB; the store's commands and answers are small (a checkpoint's
	// state, up to its limit, goes through in several reads or writes), so
	// 64 KiB each keeps a few MiB out of the heap, and as much again out
	// of the garbage the collector lets pile up (docs/performance.md).
	copt.ReadBufferEachConn, copt.WriteBufferEachConn = clientBuffer, clientBuffer
	// In a cluster, re-read the slot map periodically too, not only after a
	// command failed: so the client forgets failed replicas and learns
	// promoted ones (ignored by a single-node client).
	copt.ClusterOption.ShardsRefreshInterval = topologyRefresh
	if copt.ClientName == "" {
		copt.ClientName = "fencegate"
	}
	return copt, nil
}

// clientBuffer is the size of each valkey-go connection's read buffer
// and of its write buffer.
const clientBuffer = 64 << 10

// urlParams are the query parameters a store URL may carry: addr (more
// seeds), client_name (the connections' CLIENT SETNAME) and skip_verify
// (valkeys:// only). valkey-go's parser reads others (dial_timeout,
// write_timeout, client_cache, max_retries, protocol, master_set, db) that
// Open overrides, that the store does not support (Sentinel) or that the
// URL's path already says (the database), and ignores every name it does
// not know: a misspelt parameter would be dropped without a word.
var urlParams = map[string]string{
	"dial_timeout":  "set FENCEGATE_VALKEY_DIAL_TIMEOUT (Options.DialTimeout) instead",
	"write_timeout": "set FENCEGATE_VALKEY_COMMAND_TIMEOUT (Options.CommandTimeout) instead",
	"db":            "give the database as the URL's path instead, valkey://host:port/3",
	"master_set":    "Valkey Sentinel is not supported",
}

// checkURLQuery refuses a store URL query that would be ignored or
// misread: a parameter outside addr, client_name and (valkeys://)
// skip_verify, one of the last two given twice, and an addr that is not
// host:port (valkey-go would take "node2" for the URL's own host on port
// 6379).
func checkURLQuery(u *url.URL) error {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return errors.New("valkeystore: the store URL's query is malformed")
	}
	for name, vals := range q {
		switch name {
		case "addr":
			for _, a := range vals {
				host, port, err := net.SplitHostPort(a)
				if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
					return fmt.Errorf("valkeystore: store URL: addr=%q is not host:port", a)
				}
			}
			continue
		case "skip_verify":
			if u.Scheme != "valkeys" && u.Scheme != "rediss" {
				return errors.New("valkeystore: store URL: skip_verify applies to valkeys:// only")
			}
		case "client_name":
		default:
			if why, ok := urlParams[name]; ok {
				return fmt.Errorf("valkeystore: store URL: parameter %q is not taken: %s", name, why)
			}
			return fmt.Errorf("valkeystore: store URL: unknown parameter %q (the query takes addr, client_name and, with valkeys://, skip_verify)", name)
		}
		if len(vals) > 1 {
			return fmt.Errorf("valkeystore: store URL: parameter %q is given more than once", name)
		}
	}
	return nil
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
