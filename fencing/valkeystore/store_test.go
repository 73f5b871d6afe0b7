package valkeystore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

var prefixSeq atomic.Int64

// freshPrefix gives every opened store its own namespace on a shared server.
func freshPrefix() string {
	return fmt.Sprintf("fgtest%d-%d", time.Now().UnixNano()%1e9, prefixSeq.Add(1))
}

func open(t testing.TB, url, prefix string) *Store {
	t.Helper()
	return openRetention(t, url, prefix, 0)
}

func openRetention(t testing.TB, url, prefix string, retention time.Duration) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{URL: url, KeyPrefix: prefix, CommandTimeout: 2 * time.Second, DialTimeout: time.Second, Retention: retention})
	if err != nil {
		t.Fatalf("Open(%s): %v", url, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// harness opens stores with fresh prefixes on one server (or cluster);
// Reopen opens a new client over the same prefix; Delete deletes a
// resource's keys (one DEL: they share a slot).
func harness(url string, retention time.Duration) fencingtest.Harness {
	return fencingtest.Harness{Open: func(t testing.TB) fencingtest.Instance {
		prefix := freshPrefix()
		s := openRetention(t, url, prefix, retention)
		return fencingtest.Instance{Store: s, Reopen: func(t testing.TB) fencing.Store {
			s.Close()
			s = openRetention(t, url, prefix, retention)
			return s
		}, ClockTokens: true, Retention: retention, Delete: func(t testing.TB, res string) {
			cmd := s.client.B().Del().Key(s.recKey(res), s.liveKey(res), s.stateKey(res)).Build()
			if err := s.client.Do(context.Background(), cmd).Error(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		}}
	}}
}

// testRetention is the retention of the stores that run the retention
// cases: short, the suite sleeps past it (keys expire on the server's
// clock).
const testRetention = time.Second

// retentionCases are the cases run again on stores with a retention (the
// others run without, so that no record expires during their sleeps).
var retentionCases = []string{"RetentionRemovesIdle", "DeletedRecord", "TokensFollowClock"}

func TestConformance(t *testing.T) {
	srv := valkeytest.Start(t)
	fencingtest.Run(t, harness(srv.URL(), 0))
	for _, name := range retentionCases {
		fencingtest.RunCase(t, harness(srv.URL(), testRetention), name)
	}
}

func TestConformanceCluster(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	fencingtest.Run(t, harness(cl.URL(), 0))
	for _, name := range retentionCases {
		fencingtest.RunCase(t, harness(cl.URL(), testRetention), name)
	}
}

func TestOpenRefusesEviction(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.WithArgs("--maxmemory-policy", "allkeys-lru"))
	_, err := Open(context.Background(), Options{URL: srv.URL()})
	if err == nil || !strings.Contains(err.Error(), "noeviction") || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("Open on an allkeys-lru server: %v, want a refusal naming allkeys-lru and noeviction", err)
	}
}

func TestOpenRefusesEvictionOnAnyClusterNode(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	cl.Nodes[2].MustDo("CONFIG", "SET", "maxmemory-policy", "volatile-lru")
	_, err := Open(context.Background(), Options{URL: cl.URL()})
	if err == nil || !strings.Contains(err.Error(), "volatile-lru") || !strings.Contains(err.Error(), cl.Nodes[2].Addr()) {
		t.Fatalf("Open on a cluster with one volatile-lru node: %v, want a refusal naming that node", err)
	}
}

func TestOpenUnreachableIsUnavailable(t *testing.T) {
	srv := valkeytest.Start(t)
	srv.Kill()
	_, err := Open(context.Background(), Options{URL: srv.URL(), DialTimeout: time.Second})
	if !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Open on a dead server: %v, want ErrUnavailable", err)
	}
}

func TestOpenOptions(t *testing.T) {
	for _, o := range []Options{
		{URL: "http://127.0.0.1:1"},
		{URL: "valkey://"},
		{URL: "valkey://127.0.0.1:1/notanumber"},
		{URL: "valkey://127.0.0.1:1", KeyPrefix: "bad{prefix}"},
		{URL: "valkey://127.0.0.1:1", KeyPrefix: "glob*"},
		{URL: "valkey://127.0.0.1:1", MaxCheckpointBytes: -1},
		// A query parameter the store would ignore or misread is refused,
		// before any connection (these would otherwise be unavailable).
		{URL: "valkey://127.0.0.1:1?adr=127.0.0.1:2"},
		{URL: "valkey://127.0.0.1:1?addr=node2"},
		{URL: "valkey://127.0.0.1:1?addr=127.0.0.1:x"},
		{URL: "valkey://127.0.0.1:1?addr=:2"},
		{URL: "valkey://127.0.0.1:1?dial_timeout=1s"},
		{URL: "valkey://127.0.0.1:1?db=2"},
		{URL: "valkey://127.0.0.1:1?master_set=m"},
		{URL: "valkey://127.0.0.1:1?skip_verify"},
		{URL: "valkey://127.0.0.1:1?client_name=a&client_name=b"},
		{URL: "valkey://127.0.0.1:1?addr=%ZZ"},
	} {
		if _, err := Open(context.Background(), o); err == nil || errors.Is(err, fencing.ErrUnavailable) {
			t.Errorf("Open(%+v): %v, want a configuration error", o, err)
		}
	}
	// The password never shows up in errors.
	_, err := Open(context.Background(), Options{URL: "valkey://u:s3cret@127.0.0.1:1", DialTimeout: 200 * time.Millisecond})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Open with a password to a closed port: %v", err)
	}
}

// TestURLQuery: a parameter the store URL takes opens the store (addr is
// what the cluster tests' URLs use): client_name names the connections.
func TestURLQuery(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL()+"?client_name=fg-test", freshPrefix())
	if _, err := s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if list := srv.MustDo("CLIENT", "LIST"); !strings.Contains(list, "name=fg-test") {
		t.Fatalf("no connection named fg-test: %s", list)
	}
}

func TestPasswordAndDB(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.WithPassword("pw"))
	_, err := Open(context.Background(), Options{URL: "valkey://" + srv.Addr()})
	if err == nil || strings.Contains(err.Error(), "pw") {
		t.Fatalf("Open without the password: %v, want a refusal", err)
	}
	s := open(t, srv.URL()+"/3", "fg")
	if _, err := s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "r", Owner: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if n := srv.MustDo("EXISTS", "fg:{r}"); n != "0" {
		t.Fatalf("db 0 holds the record (EXISTS=%s); want it in db 3", n)
	}
	if n := srv.MustDo("DBSIZE"); n != "0" {
		t.Fatalf("db 0 has %s keys", n)
	}
}

// TestKeysAreHashTagged checks the key layout the cluster relies on.
func TestKeysAreHashTagged(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), "fgkeys")
	ctx := context.Background()
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "job:7", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: "job:7", Owner: "a", Token: l.Token, State: []byte(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	keys := strings.Split(srv.MustDo("KEYS", "fgkeys:*"), "\n")
	want := map[string]bool{"fgkeys:{job:7}": true, "fgkeys:{job:7}:live": true, "fgkeys:{job:7}:state": true}
	if len(keys) != len(want) {
		t.Fatalf("keys %q, want %v", keys, want)
	}
	for _, k := range keys {
		if !want[k] {
			t.Fatalf("unexpected key %q", k)
		}
	}
	// Released: the index key goes, the record (issued, hw) stays, with no TTL.
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "job:7", Owner: "a", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	if n := srv.MustDo("EXISTS", "fgkeys:{job:7}:live"); n != "0" {
		t.Fatal("live index key kept after release")
	}
	if ttl := srv.MustDo("PTTL", "fgkeys:{job:7}"); ttl != "-1" {
		t.Fatalf("record PTTL %s, want -1 (never expires)", ttl)
	}
}

// TestTokensAboveServerClock pins the token rule: a new token is at least
// the server's TIME in microseconds, and strictly above the previous one.
func TestTokensFollowServerClock(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	ctx := context.Background()
	before := serverMicros(t, srv)
	var prev fencing.Token
	for i := range 50 {
		l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "clock", Owner: fmt.Sprint("o", i), TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if uint64(l.Token) < before || l.Token <= prev {
			t.Fatalf("token %d: want >= server µs %d and > previous %d", l.Token, before, prev)
		}
		prev = l.Token
		if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: "clock", Owner: l.Owner, Token: l.Token}); err != nil {
			t.Fatal(err)
		}
	}
	if after := serverMicros(t, srv); uint64(prev) > after {
		t.Fatalf("token %d ahead of the server clock %d", prev, after)
	}
}

func serverMicros(t testing.TB, srv *valkeytest.Server) uint64 {
	t.Helper()
	parts := strings.Split(srv.MustDo("TIME"), "\n")
	var sec, usec uint64
	fmt.Sscan(parts[0], &sec)
	fmt.Sscan(parts[1], &usec)
	return sec*1_000_000 + usec
}

func TestBatchAdmit(t *testing.T) {
	srv := valkeytest.Start(t)
	fencingtest.CheckBatchAdmit(t, open(t, srv.URL(), freshPrefix()))
}

func TestBatchAdmitCluster(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	s := open(t, cl.URL(), freshPrefix())
	fencingtest.CheckBatchAdmit(t, s)
	// A request's node follows the slot map: no mark readers.
	if r, err := s.OpenMarkReader(context.Background()); r != nil || err != nil {
		t.Fatalf("OpenMarkReader on a cluster: %v, %v; want none", r, err)
	}
}
