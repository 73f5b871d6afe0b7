package valkeystore

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// monitor is a MONITOR connection to a server: every command the server
// runs, those a script runs included, as a line.
type monitor struct {
	conn net.Conn
	mu   sync.Mutex
	cmds []monitored
	err  error // a line that did not parse
	done chan struct{}
}

// monitored is one command as MONITOR reports it: the client that sent it
// ("lua" for a command run by a script) and its arguments.
type monitored struct {
	client string
	args   []string
}

func startMonitor(t *testing.T, srv *valkeytest.Server) *monitor {
	t.Helper()
	c, err := net.DialTimeout("tcp", srv.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if l, err := r.ReadString('\n'); err != nil || strings.TrimSpace(l) != "+OK" {
		t.Fatalf("MONITOR: %q %v", l, err)
	}
	c.SetReadDeadline(time.Time{})
	m := &monitor{conn: c, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			cmd, err := parseMonitorLine(strings.TrimRight(l, "\r\n"))
			m.mu.Lock()
			if err != nil && m.err == nil {
				m.err = fmt.Errorf("MONITOR line %q: %w", l, err)
			}
			m.cmds = append(m.cmds, cmd)
			m.mu.Unlock()
		}
	}()
	return m
}

// stop waits until the server reported a last command of its own, closes
// the connection and returns every command seen.
func (m *monitor) stop(t *testing.T, srv *valkeytest.Server) []monitored {
	t.Helper()
	const end = "fencegate-monitor-end"
	srv.MustDo("ECHO", end)
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.mu.Lock()
		n := len(m.cmds)
		last := monitored{}
		if n > 0 {
			last = m.cmds[n-1]
		}
		m.mu.Unlock()
		if strings.EqualFold(last.argOr(0), "ECHO") && last.argOr(1) == end {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("MONITOR did not report the closing ECHO within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	m.conn.Close()
	<-m.done
	if m.err != nil {
		t.Fatal(m.err)
	}
	return m.cmds
}

func (c monitored) argOr(i int) string {
	if i < len(c.args) {
		return c.args[i]
	}
	return ""
}

// parseMonitorLine parses `+<time> [<db> <client>] "arg" "arg" ...`, the
// arguments quoted as the server's sdscatrepr quotes them.
func parseMonitorLine(l string) (monitored, error) {
	l = strings.TrimPrefix(l, "+")
	open := strings.IndexByte(l, '[')
	end := strings.Index(l, "] ")
	if open < 0 || end < open {
		return monitored{}, errors.New("no [db client]")
	}
	_, client, _ := strings.Cut(l[open+1:end], " ")
	var out monitored
	out.client = client
	s := l[end+2:]
	for len(s) > 0 {
		if s[0] == ' ' {
			s = s[1:]
			continue
		}
		if s[0] != '"' {
			return monitored{}, fmt.Errorf("argument does not start with a quote at %q", s)
		}
		var b strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] != '\\' {
				b.WriteByte(s[i])
				continue
			}
			i++
			if i >= len(s) {
				return monitored{}, errors.New("dangling backslash")
			}
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				if i+2 >= len(s) {
					return monitored{}, errors.New("short \\x escape")
				}
				v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
				if err != nil {
					return monitored{}, err
				}
				b.WriteByte(byte(v))
				i += 2
			default:
				b.WriteByte(s[i])
			}
		}
		if i >= len(s) {
			return monitored{}, errors.New("unterminated argument")
		}
		out.args = append(out.args, b.String())
		s = s[i+1:]
	}
	if len(out.args) == 0 {
		return monitored{}, errors.New("no command")
	}
	return out, nil
}

// invocation is one script run: its name, the KEYS it was called with and
// the commands it ran.
type invocation struct {
	name string
	keys []string
	cmds [][]string
}

func isEval(c monitored) bool {
	n := strings.ToUpper(c.argOr(0))
	return c.client != "lua" && (n == "EVAL" || n == "EVALSHA" || n == "EVAL_RO" || n == "EVALSHA_RO")
}

// invocations groups the commands scripts ran under the EVAL or EVALSHA
// that ran them. A script runs atomically, so its commands are adjacent to
// its EVAL line in the monitor stream: after it (Redis 7) or, on servers
// that report a command once it has run, before it; after says which.
// names maps a script's SHA1 to its name.
func invocations(t *testing.T, cmds []monitored, after bool, names map[string]string) []*invocation {
	t.Helper()
	owner := func(c monitored) *invocation {
		sha := c.argOr(1)
		if strings.HasPrefix(strings.ToUpper(c.argOr(0)), "EVAL") && !strings.HasPrefix(strings.ToUpper(c.argOr(0)), "EVALSHA") {
			h := sha1.Sum([]byte(sha))
			sha = hex.EncodeToString(h[:])
		}
		name, ok := names[sha]
		if !ok {
			name = "unknown script " + sha
		}
		n, err := strconv.Atoi(c.argOr(2))
		if err != nil || 3+n > len(c.args) {
			t.Fatalf("%s: bad numkeys in %q", name, c.args)
		}
		return &invocation{name: name, keys: c.args[3 : 3+n]}
	}
	var out []*invocation
	var cur *invocation    // after: the EVAL whose commands follow
	var pending [][]string // !after: script commands waiting for their EVAL
	for _, c := range cmds {
		if c.client == "lua" {
			if after {
				if cur == nil {
					t.Fatalf("script command %q not preceded by an EVAL", c.args)
				}
				cur.cmds = append(cur.cmds, c.args)
			} else {
				pending = append(pending, c.args)
			}
			continue
		}
		cur = nil
		if !isEval(c) {
			if len(pending) > 0 {
				t.Fatalf("script commands %q followed by %q, not by their EVAL", pending, c.args)
			}
			continue
		}
		inv := owner(c)
		out = append(out, inv)
		if after {
			cur = inv
		} else {
			inv.cmds, pending = pending, nil
		}
	}
	if len(pending) > 0 {
		t.Fatalf("script commands %q without their EVAL", pending)
	}
	return out
}

// TestScriptsDeclareTheirKeys runs every script through the Store's
// operations against a real server with MONITOR on, and checks that every
// key a command inside a script touched (as the server's COMMAND GETKEYS
// names it) is among the KEYS the script was called with: Valkey and
// Redis Cluster, their proxies and their tooling require a script to
// declare every key it accesses. A shard channel (SPUBLISH) is not a key.
func TestScriptsDeclareTheirKeys(t *testing.T) {
	srv := valkeytest.Start(t)
	valkeytest.StartReplica(t, srv) // for WaitReplicas (confirm.lua)
	mon := startMonitor(t, srv)
	ctx := context.Background()

	// Which side of its EVAL does this server report a script's commands?
	const probe = "fencegate-keys-probe"
	srv.MustDo("EVAL", "redis.call('EXISTS', KEYS[1]) return 1", "1", probe)

	names := map[string]string{}
	for name, src := range map[string]string{
		"acquire": source("acquire"), "renew": source("renew"), "release": source("release"),
		"checkpoint": source("checkpoint"), "readcheckpoint": source("readcheckpoint"),
		"status": source("status"), "admit": source("admit"), "list": source("list"),
		"ping": source("ping"), "confirm": source("confirm"), "lift": source("lift"),
		"admit_register": admitRegisterSource(), "barrier_check": barrierSource("barrier_check"),
		"barrier_leave": barrierSource("barrier_leave"),
	} {
		h := sha1.Sum([]byte(src))
		names[hex.EncodeToString(h[:])] = name
	}

	// With a retention, every script that writes a record applies it
	// (fg_keep), the path that reads the barrier's TTL.
	s := openRetention(t, srv.URL(), freshPrefix(), time.Hour)
	const res = "r"
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	a, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "a", TTL: time.Minute})
	must("acquire", err)
	_, err = s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "a", TTL: time.Minute})
	must("acquire (extend)", err)
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "b", TTL: time.Minute}); !errors.Is(err, fencing.ErrLeaseHeld) {
		t.Fatalf("acquire of a held lease: %v", err)
	}
	_, err = s.Renew(ctx, fencing.RenewRequest{Resource: res, Owner: "a", Token: a.Token})
	must("renew", err)
	_, err = s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: res, Owner: "a", Token: a.Token, State: []byte(`{"n":1}`)})
	must("checkpoint", err)
	_, err = s.ReadCheckpoint(ctx, res)
	must("read checkpoint", err)
	_, err = s.Status(ctx, res)
	must("status", err)
	_, err = s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: a.Token})
	must("admit", err)
	snapshot := srv.MustDo("DUMP", s.recKey(res)) // the record before the writes below, for a rollback
	out, errs := make([]fencing.Admission, 1), make([]error, 1)
	s.AdmitBatch(ctx, []fencing.AdmitRequest{{Resource: res, Token: a.Token}}, out, errs)
	must("admit batch", errs[0])
	_, err = s.List(ctx, fencing.ListRequest{})
	must("list", err)
	_, err = s.run(ctx, "ping", pingScript, []string{s.prefix + ":ping{x}"}, nil) // run per primary on a cluster
	must("ping", err)

	// The shared barrier: a leave that wakes a write behind it.
	_, low, _, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: a.Token}, "g", time.Minute)
	must("admit register", err)
	_, err = s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "a", Token: a.Token})
	must("release", err)
	b, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "b", TTL: time.Minute})
	must("acquire after release", err)
	_, high, behind, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: b.Token}, "g", time.Minute)
	must("admit register behind", err)
	if !behind {
		t.Fatal("the second write is not behind the first")
	}
	must("leave", s.Leave(ctx, low))
	_, err = s.WaitLower(ctx, high)
	must("wait lower", err)
	must("leave", s.Leave(ctx, high))

	// A rolled-back record: the next admission lifts it (lift.lua).
	srv.MustDo("RESTORE", s.recKey(res), "0", snapshot, "REPLACE")
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: b.Token}); !errors.Is(err, fencing.ErrStoreLost) {
		t.Fatalf("admission on a rolled-back record: %v, want ErrStoreLost", err)
	}

	// WaitReplicas: the probe, the write and WAIT, the confirmation.
	sw, err := Open(ctx, Options{URL: srv.URL(), KeyPrefix: freshPrefix(), CommandTimeout: 2 * time.Second, DialTimeout: time.Second,
		WaitReplicas: 1, WaitTimeout: 5 * time.Second, Retention: time.Hour})
	must("open with WaitReplicas", err)
	t.Cleanup(func() { sw.Close() })
	w, err := sw.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "w", TTL: time.Minute})
	must("acquire (WaitReplicas)", err)
	_, err = sw.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: w.Token})
	must("admit (WaitReplicas)", err)

	cmds := mon.stop(t, srv)
	after := -1
	for i, c := range cmds {
		if c.client == "lua" && strings.EqualFold(c.argOr(0), "EXISTS") && c.argOr(1) == probe {
			if i > 0 && isEval(cmds[i-1]) {
				after = 1
			} else if i+1 < len(cmds) && isEval(cmds[i+1]) {
				after = 0
			}
			break
		}
	}
	if after < 0 {
		t.Fatal("MONITOR did not report the probe script's command next to its EVAL: it cannot show what scripts touch")
	}
	invs := invocations(t, cmds, after == 1, names)

	// keysOf asks the server which arguments of cmd are keys.
	cache := map[string][]string{}
	keysOf := func(cmd []string) []string {
		if len(cmd) < 2 {
			return nil // TIME: no arguments, no keys
		}
		id := strings.Join(cmd, "\x00")
		if k, ok := cache[id]; ok {
			return k
		}
		k, err := s.client.Do(ctx, s.client.B().Arbitrary("COMMAND", "GETKEYS").Args(cmd...).Build()).AsStrSlice()
		if err != nil {
			if !strings.Contains(err.Error(), "no key arguments") {
				t.Fatalf("COMMAND GETKEYS %q: %v", cmd, err)
			}
			k = nil
		}
		cache[id] = k
		return k
	}
	seen := map[string]int{}
	var bad []string
	for _, inv := range invs {
		seen[inv.name]++
		for _, cmd := range inv.cmds {
			for _, k := range keysOf(cmd) {
				if !slices.Contains(inv.keys, k) {
					bad = append(bad, fmt.Sprintf("%s (KEYS %q) ran %q: key %q not in KEYS", inv.name, inv.keys, cmd, k))
				}
			}
		}
	}
	slices.Sort(bad)
	for _, b := range slices.Compact(bad) {
		t.Error(b)
	}
	for _, name := range names {
		if seen[name] == 0 {
			t.Errorf("script %s never ran: the test does not cover it", name)
		}
	}
}
