package linear

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
)

// Opener opens a fresh, empty store on the given fake clock for one rapid
// run; the run closes it.
type Opener func(t *rapid.T, clock *fencingtest.FakeClock) fencing.Store

// StateMachine is a rapid property: a random sequence of calls (on two
// resources, by three owners, with tokens the calls returned, neighbours of
// them and forged ones) and clock steps, each answer checked at once
// against the model (Step); rapid shrinks a failing sequence to a minimal
// one. The store must take a fencingtest.FakeClock (the memory and file
// stores do), so every call runs at a known instant and the model is
// deterministic, and must issue tokens issued+1.
func StateMachine(open Opener) func(*rapid.T) {
	return func(t *rapid.T) {
		clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
		st := open(t, clock)
		defer st.Close()
		resources := []string{"sm-a", "sm-b"}
		owners := []string{"w0", "w1", "w2"}
		states := map[string]State{}
		var tokens []fencing.Token // tokens answers showed, any resource
		ctx := context.Background()
		token := func(t *rapid.T) fencing.Token {
			if len(tokens) == 0 || rapid.IntRange(0, 9).Draw(t, "forged") == 0 {
				return fencing.Token(rapid.Uint64Range(1, 1<<63).Draw(t, "token"))
			}
			tok := rapid.SampledFrom(tokens).Draw(t, "seen")
			return max(1, tok+fencing.Token(rapid.IntRange(-1, 1).Draw(t, "delta")))
		}
		ttl := func(t *rapid.T) int64 {
			return int64(rapid.IntRange(1, 5).Draw(t, "ttl_s")) * 1000
		}
		do := func(t *rapid.T, in Input) {
			in.Resource = rapid.SampledFrom(resources).Draw(t, "resource")
			s, ok := states[in.Resource]
			if !ok {
				s = NewState(false)
			}
			in.Call = clock.Now().UnixMilli()
			out, err := call1(ctx, st, in)
			classifyErr(&out, err)
			out.Return = clock.Now().UnixMilli()
			if out.Result == Ambiguous || out.Result == Unavailable {
				t.Fatalf("%s: store fault %v", in.Kind, err)
			}
			next := Step(s, in, out)
			if len(next) != 1 {
				t.Fatalf("the model does not accept\n  %s\nfrom state\n  %s", describe(in, out), describeState(s))
			}
			states[in.Resource] = next[0]
			for _, tok := range []fencing.Token{out.Lease.Token, out.Issued, out.Prev.Token} {
				if tok != 0 {
					tokens = append(tokens, tok)
				}
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"acquire": func(t *rapid.T) {
				do(t, Input{Kind: Acquire, Owner: rapid.SampledFrom(owners).Draw(t, "owner"), TTL: ttl(t)})
			},
			"renew": func(t *rapid.T) {
				in := Input{Kind: Renew, Owner: rapid.SampledFrom(owners).Draw(t, "owner"), Token: token(t)}
				if rapid.Bool().Draw(t, "new_ttl") {
					in.TTL = ttl(t)
				}
				do(t, in)
			},
			"release": func(t *rapid.T) {
				do(t, Input{Kind: Release, Owner: rapid.SampledFrom(owners).Draw(t, "owner"), Token: token(t), Finished: rapid.Bool().Draw(t, "finished")})
			},
			"checkpoint": func(t *rapid.T) {
				state := fmt.Sprintf(`{"n":%d}`, rapid.IntRange(0, 1000).Draw(t, "state"))
				do(t, Input{Kind: Checkpoint, Owner: rapid.SampledFrom(owners).Draw(t, "owner"), Token: token(t), State: state})
			},
			"readCheckpoint": func(t *rapid.T) { do(t, Input{Kind: ReadCheckpoint}) },
			"status":         func(t *rapid.T) { do(t, Input{Kind: Status}) },
			"admit": func(t *rapid.T) {
				do(t, Input{Kind: Admit, Token: token(t), RequireLive: rapid.Bool().Draw(t, "require_live")})
			},
			"advance": func(t *rapid.T) {
				// Up to 6 s in ms: past, onto and before lease expiries.
				clock.Advance(time.Duration(rapid.IntRange(1, 6000).Draw(t, "ms")) * time.Millisecond)
			},
		})
	}
}

// CheckStateMachine runs StateMachine with rapid.
func CheckStateMachine(t *testing.T, open Opener) {
	t.Helper()
	rapid.Check(t, StateMachine(open))
}
