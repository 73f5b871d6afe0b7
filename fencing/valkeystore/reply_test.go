package valkeystore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// replyEnv is one case's resource on a real server, with the raw script
// runner and the Store to prepare it.
type replyEnv struct {
	t   *testing.T
	s   *Store
	res string
}

func (e replyEnv) rec() string   { return e.s.recKey(e.res) }
func (e replyEnv) live() string  { return e.s.liveKey(e.res) }
func (e replyEnv) state() string { return e.s.stateKey(e.res) }
func (e replyEnv) bar() string   { return e.s.barKey(e.res) }

// leaseKeys and admitKeys are the KEYS the Store calls the scripts with.
func (e replyEnv) leaseKeys() []string { return e.s.leaseKeys(e.res) }
func (e replyEnv) admitKeys() []string { return e.s.admitKeys(e.res) }

// raw runs a script and returns its reply undecoded.
func (e replyEnv) raw(sc *valkey.Lua, keys []string, args ...string) []string {
	e.t.Helper()
	r, err := e.s.run(context.Background(), "test", sc, keys, args)
	if err != nil {
		e.t.Fatalf("script: %v", err)
	}
	return r
}

// acquire takes a lease through the Store (the ordinary path) and returns
// it with the record's floor.
func (e replyEnv) acquire(owner string) (fencing.Lease, fencing.Token) {
	e.t.Helper()
	l, err := e.s.Acquire(context.Background(), fencing.AcquireRequest{Resource: e.res, Owner: owner, TTL: time.Minute})
	if err != nil {
		e.t.Fatalf("Acquire: %v", err)
	}
	f, err := e.s.client.Do(context.Background(), e.s.client.B().Hget().Key(e.rec()).Field("floor").Build()).ToString()
	if err != nil {
		e.t.Fatalf("HGET floor: %v", err)
	}
	floor, _ := parseToken(f)
	return l, floor
}

func (e replyEnv) admit(tok fencing.Token) {
	e.t.Helper()
	if _, err := e.s.Admit(context.Background(), fencing.AdmitRequest{Resource: e.res, Token: tok}); err != nil {
		e.t.Fatalf("Admit(%d): %v", tok, err)
	}
}

func (e replyEnv) release(l fencing.Lease) {
	e.t.Helper()
	if _, err := e.s.Release(context.Background(), fencing.ReleaseRequest{Resource: e.res, Owner: l.Owner, Token: l.Token, Finished: true}); err != nil {
		e.t.Fatalf("Release: %v", err)
	}
}

// checkNamed fails when a named reply did not decode, or carried a name
// its decoder never read (a field the script sends and Go ignores).
func checkNamed(t *testing.T, n *named) {
	t.Helper()
	if err := n.err(); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if u := n.unread(); len(u) > 0 {
		t.Fatalf("the reply %q has names its decoder does not read: %v", n.raw, u)
	}
}

func tokStr(t fencing.Token) string { return strconv.FormatUint(uint64(t), 10) }

// TestScriptReplies runs every branch of every script against a real
// server and decodes its reply with the script's decoder: each reply
// decodes, every name it carries is read, and the typed fields hold what
// the Store's state says they must.
func TestScriptReplies(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	ttl := "60000"
	cases := []struct {
		name string
		run  func(e replyEnv)
	}{
		{"acquire/OK new", func(e replyEnv) {
			r := e.raw(acquireScript, e.leaseKeys(), "alice", ttl, "0", "0", "")
			a, n := decodeAcquire(r)
			checkNamed(e.t, n)
			if a.held || a.lease.token == 0 || a.lease.ttlMs != 60000 || a.lease.expiresMs-a.lease.acquiredMs != 60000 || a.floor == 0 || a.floor >= a.lease.token {
				e.t.Fatalf("acquire of a new resource: %+v", a)
			}
		}},
		{"acquire/OK extended", func(e replyEnv) {
			l, floor := e.acquire("alice")
			r := e.raw(acquireScript, e.leaseKeys(), "alice", "90000", "0", tokStr(l.Token), tokStr(floor))
			a, n := decodeAcquire(r)
			checkNamed(e.t, n)
			if a.held || a.lease.token != l.Token || a.lease.ttlMs != 90000 || a.lease.acquiredMs != l.AcquiredAt.UnixMilli() || a.floor != floor {
				e.t.Fatalf("acquire extending %+v (floor %d): %+v", l, floor, a)
			}
		}},
		{"acquire/HELD", func(e replyEnv) {
			l, _ := e.acquire("alice")
			r := e.raw(acquireScript, e.leaseKeys(), "bob", ttl, "0", "0", "")
			a, n := decodeAcquire(r)
			checkNamed(e.t, n)
			if !a.held || a.holder != "alice" || a.expiresMs != l.ExpiresAt.UnixMilli() || a.nowMs <= 0 || a.nowMs > a.expiresMs {
				e.t.Fatalf("acquire of a held resource: %+v, lease %+v", a, l)
			}
		}},
		{"renew/OK", func(e replyEnv) {
			l, _ := e.acquire("alice")
			r := e.raw(renewScript, e.leaseKeys(), "alice", tokStr(l.Token), "5000")
			a, n := decodeLease("renew", r)
			checkNamed(e.t, n)
			if a.lost || a.lease.token != l.Token || a.lease.ttlMs != 5000 || a.lease.acquiredMs != l.AcquiredAt.UnixMilli() {
				e.t.Fatalf("renew: %+v", a)
			}
		}},
		{"renew/LOST", func(e replyEnv) {
			l, _ := e.acquire("alice")
			r := e.raw(renewScript, e.leaseKeys(), "bob", tokStr(l.Token), "")
			a, n := decodeLease("renew", r)
			checkNamed(e.t, n)
			if !a.lost {
				e.t.Fatalf("renew by another owner: %+v", a)
			}
		}},
		{"checkpoint/OK", func(e replyEnv) {
			l, _ := e.acquire("alice")
			r := e.raw(checkpointScript, e.leaseKeys(), "alice", tokStr(l.Token), `{"n":1}`)
			a, n := decodeLease("checkpoint", r)
			checkNamed(e.t, n)
			if a.lost || a.lease.token != l.Token || a.lease.ttlMs != 60000 {
				e.t.Fatalf("checkpoint: %+v", a)
			}
		}},
		{"checkpoint/LOST", func(e replyEnv) {
			l, _ := e.acquire("alice")
			r := e.raw(checkpointScript, e.leaseKeys(), "alice", tokStr(l.Token+1), `{}`)
			a, n := decodeLease("checkpoint", r)
			checkNamed(e.t, n)
			if !a.lost {
				e.t.Fatalf("checkpoint with another token: %+v", a)
			}
		}},
		{"release/OK released", func(e replyEnv) {
			l, _ := e.acquire("alice")
			r := e.raw(releaseScript, e.leaseKeys(), "alice", tokStr(l.Token), "1")
			a, n := decodeRelease(r)
			checkNamed(e.t, n)
			if a.lost || !a.released {
				e.t.Fatalf("release: %+v", a)
			}
		}},
		{"release/OK already ended", func(e replyEnv) {
			l, _ := e.acquire("alice")
			e.release(l)
			r := e.raw(releaseScript, e.leaseKeys(), "alice", tokStr(l.Token), "0")
			a, n := decodeRelease(r)
			checkNamed(e.t, n)
			if a.lost || a.released {
				e.t.Fatalf("second release: %+v", a)
			}
		}},
		{"release/LOST", func(e replyEnv) {
			l, _ := e.acquire("alice")
			r := e.raw(releaseScript, e.leaseKeys(), "bob", tokStr(l.Token), "0")
			a, n := decodeRelease(r)
			checkNamed(e.t, n)
			if !a.lost {
				e.t.Fatalf("release by another owner: %+v", a)
			}
		}},
		{"status/unknown resource", func(e replyEnv) {
			r := e.raw(statusScript, []string{e.rec(), e.state()})
			rec, n := decodeRecord("status", e.res, r, false)
			checkNamed(e.t, n)
			if rec.now <= 0 || rec.issued != 0 || rec.highWater != 0 || rec.live != nil || rec.previous != nil || rec.saved != nil {
				e.t.Fatalf("status of an unknown resource: %+v", rec)
			}
		}},
		{"status/live lease with checkpoint", func(e replyEnv) {
			l, _ := e.acquire("alice")
			e.admit(l.Token)
			if _, err := e.s.Checkpoint(context.Background(), fencing.CheckpointRequest{Resource: e.res, Owner: "alice", Token: l.Token, State: []byte(`[1,2]`)}); err != nil {
				e.t.Fatal(err)
			}
			r := e.raw(statusScript, []string{e.rec(), e.state()})
			rec, n := decodeRecord("status", e.res, r, false)
			checkNamed(e.t, n)
			if rec.issued != l.Token || rec.highWater != l.Token || rec.live == nil || rec.live.Owner != "alice" || rec.live.Token != l.Token ||
				rec.live.TTL != time.Minute || rec.previous != nil || rec.saved == nil || rec.saved.Token != l.Token || rec.saved.SizeBytes != 5 {
				e.t.Fatalf("status of a live lease with a checkpoint: %+v (live %+v, saved %+v)", rec, rec.live, rec.saved)
			}
		}},
		{"status/previous leases", func(e replyEnv) {
			l1, _ := e.acquire("alice")
			e.release(l1)
			l2, _ := e.acquire("bob")
			e.release(l2)
			r := e.raw(statusScript, []string{e.rec(), e.state()})
			rec, n := decodeRecord("status", e.res, r, false)
			checkNamed(e.t, n)
			want := fencing.Previous{Owner: "bob", Token: l2.Token, Ended: fencing.EndReleased, Finished: true}
			if rec.live != nil || rec.previous == nil || *rec.previous != want || rec.issued != l2.Token {
				e.t.Fatalf("status after two releases: %+v, previous %+v", rec, rec.previous)
			}
		}},
		{"status/previous from before the last lease", func(e replyEnv) {
			l1, _ := e.acquire("alice")
			e.release(l1)
			l2, _ := e.acquire("bob")
			r := e.raw(statusScript, []string{e.rec(), e.state()})
			rec, n := decodeRecord("status", e.res, r, false)
			checkNamed(e.t, n)
			want := fencing.Previous{Owner: "alice", Token: l1.Token, Ended: fencing.EndReleased, Finished: true}
			if rec.live == nil || rec.live.Token != l2.Token || rec.previous == nil || *rec.previous != want {
				e.t.Fatalf("status of bob's lease after alice's: %+v, previous %+v", rec, rec.previous)
			}
		}},
		{"readcheckpoint/with state", func(e replyEnv) {
			l, _ := e.acquire("alice")
			if _, err := e.s.Checkpoint(context.Background(), fencing.CheckpointRequest{Resource: e.res, Owner: "alice", Token: l.Token, State: []byte(`{"a":"b"}`)}); err != nil {
				e.t.Fatal(err)
			}
			r := e.raw(readCheckpointScript, []string{e.rec(), e.state()})
			rec, n := decodeRecord("read checkpoint", e.res, r, true)
			checkNamed(e.t, n)
			if rec.saved == nil || rec.saved.Token != l.Token || string(rec.state) != `{"a":"b"}` {
				e.t.Fatalf("read checkpoint: %+v, state %q", rec.saved, rec.state)
			}
		}},
		{"readcheckpoint/none", func(e replyEnv) {
			e.acquire("alice")
			r := e.raw(readCheckpointScript, []string{e.rec(), e.state()})
			rec, n := decodeRecord("read checkpoint", e.res, r, true)
			checkNamed(e.t, n)
			if rec.saved != nil || len(rec.state) != 0 || rec.live == nil {
				e.t.Fatalf("read checkpoint without one: %+v, state %q", rec.saved, rec.state)
			}
		}},
		{"list/LIVE", func(e replyEnv) {
			l, _ := e.acquire("alice")
			r := e.raw(listScript, []string{e.rec()})
			a, n := decodeList(r)
			checkNamed(e.t, n)
			if !a.live || a.owner != "alice" || a.lease.of(e.res, a.owner) != l {
				e.t.Fatalf("list: %+v, want %+v", a, l)
			}
		}},
		{"list/NONE", func(e replyEnv) {
			l, _ := e.acquire("alice")
			e.release(l)
			r := e.raw(listScript, []string{e.rec()})
			a, n := decodeList(r)
			checkNamed(e.t, n)
			if a.live {
				e.t.Fatalf("list of a released lease: %+v", a)
			}
		}},
		{"lift/OK", func(e replyEnv) {
			l, _ := e.acquire("alice")
			to := l.Token + 1000
			r := e.raw(liftScript, e.leaseKeys(), tokStr(to))
			a, n := decodeLift(r)
			checkNamed(e.t, n)
			if a.issued != to || a.floor != to {
				e.t.Fatalf("lift to %d: %+v", to, a)
			}
		}},
		{"barrier_check/BARRIER", func(e replyEnv) {
			l1, _ := e.acquire("alice")
			if _, _, _, err := e.s.AdmitRegister(context.Background(), fencing.AdmitRequest{Resource: e.res, Token: l1.Token}, "g", time.Minute); err != nil {
				e.t.Fatal(err)
			}
			e.release(l1)
			l2, _ := e.acquire("bob")
			_, own, _, err := e.s.AdmitRegister(context.Background(), fencing.AdmitRequest{Resource: e.res, Token: l2.Token}, "g", time.Minute)
			if err != nil {
				e.t.Fatal(err)
			}
			r := e.raw(barrierCheckScript, []string{e.bar()}, tokStr(l2.Token), own.ID)
			a, n := decodeBarrierCheck(r)
			checkNamed(e.t, n)
			if a.lower != 1 || a.wait <= 0 || a.wait > time.Minute || a.expired != 0 || a.gone {
				e.t.Fatalf("barrier check behind one entry: %+v", a)
			}
		}},
		{"barrier_check/GONE", func(e replyEnv) {
			l, _ := e.acquire("alice")
			_, own, _, err := e.s.AdmitRegister(context.Background(), fencing.AdmitRequest{Resource: e.res, Token: l.Token}, "g", time.Minute)
			if err != nil {
				e.t.Fatal(err)
			}
			e.raw(valkey.NewLuaScript("redis.call('DEL', KEYS[1]) return {'OK'}"), []string{e.bar()}) // the server loses the set
			r := e.raw(barrierCheckScript, []string{e.bar()}, tokStr(l.Token), own.ID)
			a, n := decodeBarrierCheck(r)
			checkNamed(e.t, n)
			if !a.gone {
				e.t.Fatalf("barrier check of an entry the server lost: %+v", a)
			}
		}},
	}
	// admit.lua and admit_register.lua: positional, typed.
	admitCases := []struct {
		name string
		run  func(e replyEnv) (r []string, write bool, want admitReply)
	}{
		{"admit/OK raised", func(e replyEnv) ([]string, bool, admitReply) {
			l, floor := e.acquire("alice")
			return e.raw(admitScript, e.admitKeys(), tokStr(l.Token), "0"), false,
				admitReply{kind: admitOK, issued: l.Token, hw: l.Token, floor: floor, raised: true}
		}},
		{"admit/OK at the mark", func(e replyEnv) ([]string, bool, admitReply) {
			l, floor := e.acquire("alice")
			e.admit(l.Token)
			return e.raw(admitScript, e.admitKeys(), tokStr(l.Token), "1"), false,
				admitReply{kind: admitOK, issued: l.Token, hw: l.Token, floor: floor}
		}},
		{"admit/NOTISSUED", func(e replyEnv) ([]string, bool, admitReply) {
			l, floor := e.acquire("alice")
			return e.raw(admitScript, e.admitKeys(), tokStr(l.Token+1), "0"), false,
				admitReply{kind: admitNotIssued, issued: l.Token, floor: floor}
		}},
		{"admit/STALE", func(e replyEnv) ([]string, bool, admitReply) {
			l1, _ := e.acquire("alice")
			e.release(l1)
			l2, _ := e.acquire("bob")
			e.admit(l2.Token)
			return e.raw(admitScript, e.admitKeys(), tokStr(l1.Token), "0"), false,
				admitReply{kind: admitStale, hw: l2.Token}
		}},
		{"admit/FLOOR", func(e replyEnv) ([]string, bool, admitReply) {
			_, floor := e.acquire("alice")
			return e.raw(admitScript, e.admitKeys(), tokStr(floor), "0"), false,
				admitReply{kind: admitFloor, hw: floor + 1}
		}},
		{"admit/FLOOR no record", func(e replyEnv) ([]string, bool, admitReply) {
			// Below the server's clock on a resource with no record: stale,
			// with the clock as the mark a record created now starts at.
			r := e.raw(admitScript, e.admitKeys(), "1", "0")
			if len(r) == 2 {
				if clock, ok := parseToken(r[1]); ok && clock > fencing.Token(time.Now().Add(-time.Hour).UnixMicro()) {
					return r, false, admitReply{kind: admitFloor, hw: clock}
				}
			}
			return r, false, admitReply{kind: admitFloor}
		}},
		{"admit/NOTISSUED no record", func(e replyEnv) ([]string, bool, admitReply) {
			return e.raw(admitScript, e.admitKeys(), tokStr(1<<60), "0"), false,
				admitReply{kind: admitNotIssued}
		}},
		{"admit/NOTHELD", func(e replyEnv) ([]string, bool, admitReply) {
			l, _ := e.acquire("alice")
			e.release(l)
			return e.raw(admitScript, e.admitKeys(), tokStr(l.Token), "1"), false,
				admitReply{kind: admitNotHeld}
		}},
		{"admit/WAIT (probe mode)", func(e replyEnv) ([]string, bool, admitReply) {
			l, _ := e.acquire("alice")
			return e.raw(admitScript, e.admitKeys(), tokStr(l.Token), "0", "1"), false,
				admitReply{kind: admitWait}
		}},
		{"admit/OK write mode", func(e replyEnv) ([]string, bool, admitReply) {
			l, floor := e.acquire("alice")
			return e.raw(admitScript, e.admitKeys(), tokStr(l.Token), "0", "2"), true,
				admitReply{kind: admitOK, issued: l.Token, hw: l.Token, floor: floor, raised: true, confirm: true}
		}},
		{"admit/OK write mode, confirmed", func(e replyEnv) ([]string, bool, admitReply) {
			l, floor := e.acquire("alice")
			e.raw(admitScript, e.admitKeys(), tokStr(l.Token), "0", "2")
			if r, err := confirmScript.Exec(context.Background(), e.s.client, []string{e.rec()}, []string{tokStr(l.Token)}).ToString(); err != nil || r != "1" {
				e.t.Fatalf("confirm: %q, %v", r, err)
			}
			return e.raw(admitScript, e.admitKeys(), tokStr(l.Token), "0", "2"), true,
				admitReply{kind: admitOK, issued: l.Token, hw: l.Token, floor: floor}
		}},
	}

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.run(replyEnv{t: t, s: s, res: "reply:" + strconv.Itoa(i)})
		})
	}
	for i, c := range admitCases {
		t.Run(c.name, func(t *testing.T) {
			e := replyEnv{t: t, s: s, res: "admit:" + strconv.Itoa(i)}
			r, write, want := c.run(e)
			got, ok := decodeAdmit(r, write)
			if !ok || got != want {
				t.Fatalf("admit reply %q decodes to %+v, %v; want %+v", r, got, ok, want)
			}
		})
	}
	t.Run("admit_register/OK", func(t *testing.T) {
		e := replyEnv{t: t, s: s, res: "register:ok"}
		l, floor := e.acquire("alice")
		e.raw(admitRegisterScript, e.admitKeys(), tokStr(l.Token), "0", "0", "0", "g:1", "60000")
		r := e.raw(admitRegisterScript, e.admitKeys(), tokStr(l.Token), "0", "0", "0", "g:2", "60000")
		a, ok := decodeAdmitRegister(r)
		want := admitReply{kind: admitOK, issued: l.Token, hw: l.Token, floor: floor}
		if !ok || a.admit != want || a.member == "" || a.barrier.lower != 0 || a.barrier.expired != 0 {
			t.Fatalf("admit_register reply %q decodes to %+v, %v", r, a, ok)
		}
	})
	t.Run("admit_register/refusal", func(t *testing.T) {
		e := replyEnv{t: t, s: s, res: "register:stale"}
		l, floor := e.acquire("alice")
		r := e.raw(admitRegisterScript, e.admitKeys(), tokStr(l.Token+1), "0", "0", "0", "g:1", "60000")
		a, ok := decodeAdmitRegister(r)
		want := admitReply{kind: admitNotIssued, issued: l.Token, floor: floor}
		if !ok || a.admit != want || a.member != "" {
			t.Fatalf("admit_register refusal %q decodes to %+v, %v", r, a, ok)
		}
	})
}

// Replies the scripts never give are corrupt: ErrAmbiguous, naming the
// problem; never a zero value taken for an answer.
func TestDecodeCorruptReplies(t *testing.T) {
	named := []struct {
		name   string
		decode func() *named
	}{
		{"acquire without floor", func() *named {
			_, n := decodeAcquire([]string{"OK", "token", "5", "ttl_ms", "1000", "acquired_ms", "1", "expires_ms", "1001"})
			return n
		}},
		{"acquire token 0", func() *named {
			_, n := decodeAcquire([]string{"OK", "token", "0", "ttl_ms", "1000", "acquired_ms", "1", "expires_ms", "1001", "floor", "1"})
			return n
		}},
		{"acquire unknown kind", func() *named { _, n := decodeAcquire([]string{"MAYBE"}); return n }},
		{"acquire odd pairs", func() *named { _, n := decodeAcquire([]string{"HELD", "holder"}); return n }},
		{"acquire positional (old)", func() *named { _, n := decodeAcquire([]string{"OK", "5", "1000", "1", "1001", "1"}); return n }},
		{"lease bad ttl", func() *named {
			_, n := decodeLease("renew", []string{"OK", "token", "5", "ttl_ms", "x", "acquired_ms", "1", "expires_ms", "1001"})
			return n
		}},
		{"release bad flag", func() *named { _, n := decodeRelease([]string{"OK", "released", "yes"}); return n }},
		{"release empty", func() *named { _, n := decodeRelease(nil); return n }},
		{"list LIVE without owner", func() *named {
			_, n := decodeList([]string{"LIVE", "token", "5", "ttl_ms", "1", "acquired_ms", "1", "expires_ms", "2"})
			return n
		}},
		{"lift bad token", func() *named { _, n := decodeLift([]string{"OK", "issued", "-1", "floor", "1"}); return n }},
		{"barrier check positional (old)", func() *named { _, n := decodeBarrierCheck([]string{"1", "0", "0"}); return n }},
		{"record owner without expiry", func() *named {
			_, n := decodeRecord("status", "r", recordReply(map[string]string{"owner": "a", "token": "5"}), false)
			return n
		}},
		{"record checkpoint without size", func() *named {
			_, n := decodeRecord("status", "r", recordReply(map[string]string{"cp_token": "5", "cp_ms": "1"}), false)
			return n
		}},
		{"record without state", func() *named {
			_, n := decodeRecord("read checkpoint", "r", recordReply(nil), true)
			return n
		}},
	}
	for _, c := range named {
		t.Run(c.name, func(t *testing.T) {
			err := c.decode().err()
			if !errors.Is(err, fencing.ErrAmbiguous) {
				t.Fatalf("decode: %v, want ErrAmbiguous", err)
			}
		})
	}
	if _, n := decodeRecord("status", "r", recordReply(nil), false); n.err() != nil {
		t.Fatalf("an all-empty record is a valid reply (an unknown resource): %v", n.err())
	}
	positional := []struct {
		r     []string
		write bool
	}{
		{nil, false},
		{[]string{"OK", "1", "1", "0"}, false},
		{[]string{"OK", "1", "1", "0", "1", "0"}, false}, // write mode's reply read as plain
		{[]string{"OK", "1", "1", "0", "0"}, true},
		{[]string{"OK", "1", "1", "2", "0"}, false}, // raised not a flag
		{[]string{"OK", "x", "1", "0", "0"}, false},
		{[]string{"STALE"}, false},
		{[]string{"NOTISSUED", "5"}, false},
		{[]string{"WAIT"}, true},
		{[]string{"NOTHELD", "x"}, false},
		{[]string{"BUSY"}, false},
	}
	for _, c := range positional {
		if a, ok := decodeAdmit(c.r, c.write); ok {
			t.Errorf("decodeAdmit(%q, write %v) = %+v, ok; want not ok", c.r, c.write, a)
		}
	}
	for _, r := range [][]string{
		{"OK", "1", "1", "0", "0"},                     // admit's OK without the registration
		{"OK", "1", "1", "0", "0", "", "0", "0", "0"},  // no member
		{"OK", "1", "1", "0", "0", "m", "x", "0", "0"}, // lower not a number
		{"WAIT"}, // not a refusal admit_register gives
	} {
		if a, ok := decodeAdmitRegister(r); ok {
			t.Errorf("decodeAdmitRegister(%q) = %+v, ok; want not ok", r, a)
		}
	}
}

// recordReply builds a status.lua reply with the given fields set and
// every other field "".
func recordReply(set map[string]string) []string {
	r := []string{"RECORD", "now_ms", "1000"}
	for _, name := range []string{"issued", "hw", "owner", "token", "ttl", "acq", "exp", "rel", "fin",
		"p_owner", "p_token", "p_ended", "p_fin", "cp_token", "cp_ms", "cp_size"} {
		r = append(r, name, set[name])
	}
	return r
}

// Every name fg_record sends is one decodeRecord reads (checked in
// TestScriptReplies too; this one also proves unread catches a new name).
func TestNamedUnreadCatchesNewName(t *testing.T) {
	r := append(recordReply(nil), "new_field", "1")
	_, n := decodeRecord("status", "r", r, false)
	if err := n.err(); err != nil {
		t.Fatal(err)
	}
	if u := n.unread(); !slices.Equal(u, []string{"new_field"}) {
		t.Fatalf("unread = %v, want [new_field]", u)
	}
}
