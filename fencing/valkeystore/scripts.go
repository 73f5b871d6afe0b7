package valkeystore

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/fencegate/fencegate/fencing"
	"github.com/valkey-io/valkey-go"
)

// The Lua scripts, one per operation, each with a KEYS/ARGV/returns contract
// in its header. lua/lib.lua is prepended to every script, so a script's
// SHA1 covers the helpers it runs with.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// script is one operation's Lua script and whether the client may retry it
// after a network error. Only the read-only scripts are retried (inside the
// command timeout). Scripts that write are sent once: acquire issues a token
// and release answers differently the second time; renew, checkpoint and
// admit are idempotent, but a retry that fails to connect would report
// "unavailable" (not performed) for a first attempt that may have run, so
// they are not retried either and their faults stay exactly classified. The
// caller (the gate) decides whether to try again.
func script(name string, retryable bool) *valkey.Lua {
	if retryable {
		return valkey.NewLuaScriptRetryable(source(name))
	}
	return valkey.NewLuaScript(source(name))
}

// source is lua/<name>.lua with lua/lib.lua prepended: the text the server
// runs, and whose SHA1 EVALSHA names.
func source(name string) string { return mustRead("lib") + mustRead(name) }

// mustRead is the embedded script lua/name.lua; it panics if it is missing
// (a build error, caught by any test).
func mustRead(name string) string {
	b, err := luaFiles.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Scripts run with EVALSHA; valkey-go falls back to EVAL (which loads the
// script) when the server answers NOSCRIPT, so they survive SCRIPT FLUSH and
// a restart of the server.
var (
	acquireScript        = script("acquire", false)
	renewScript          = script("renew", false)
	releaseScript        = script("release", false)
	checkpointScript     = script("checkpoint", false)
	readCheckpointScript = script("readcheckpoint", true)
	statusScript         = script("status", true)
	admitScript          = script("admit", false)
	listScript           = script("list", true)
	pingScript           = script("ping", false)
	confirmScript        = script("confirm", false)
	liftScript           = script("lift", false)
)

// Keys of a resource; see the package doc.
func (s *Store) recKey(res string) string   { return s.prefix + ":{" + res + "}" }
func (s *Store) liveKey(res string) string  { return s.prefix + ":{" + res + "}:live" }
func (s *Store) stateKey(res string) string { return s.prefix + ":{" + res + "}:state" }

// A script is called with every key it touches in KEYS, never a name it
// builds itself (Valkey and Redis Cluster, their proxies and tooling
// require it; TestScriptsDeclareTheirKeys checks it on a real server).

// leaseKeys are the KEYS of the scripts that write a lease (acquire,
// renew, release, checkpoint, lift): the record, the live-lease index, the
// checkpoint state and the barrier entries, whose TTL the retention reads
// (fg_keep).
func (s *Store) leaseKeys(res string) []string {
	return []string{s.recKey(res), s.liveKey(res), s.stateKey(res), s.barKey(res)}
}

// run executes one script with the command timeout and returns its array
// reply, classifying faults; a READONLY reply also sets the role fault
// (see health.go).
func (s *Store) run(ctx context.Context, op string, sc *valkey.Lua, keys, args []string) ([]string, error) {
	if err := s.checkOpen(op); err != nil {
		return nil, err
	}
	if err := s.checkPolicy(op); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cmdTimeout)
	defer cancel()
	res := sc.Exec(ctx, s.client, keys, args)
	s.noteReadOnly(res.Error())
	return scriptReply(op, res)
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
