package fencingtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/fencegate/fencegate/fencing"
)

// outcome is one goroutine's result of one call, judged later by the test
// goroutine (t.Fatal may only be called there).
type outcome struct {
	lease fencing.Lease
	err   error
}

func testConcurrentAcquireOneOwner(s *suite) {
	const workers, resources = 32, 4
	res := func(r int) string { return fmt.Sprintf("race:one:%d", r) }
	results := make([][resources]outcome, workers)
	var start, done sync.WaitGroup
	start.Add(1)
	for w := range workers {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			for i := range resources {
				r := (w + i) % resources // vary the order across workers
				l, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: res(r), Owner: fmt.Sprintf("w%d", w), TTL: longTTL})
				results[w][r] = outcome{l, err}
			}
		}()
	}
	start.Done()
	done.Wait()
	for r := range resources {
		var winner *fencing.Lease
		for w := range workers {
			o := results[w][r]
			if o.err == nil {
				if winner != nil {
					s.t.Fatalf("%s: both %s (token %d) and %s (token %d) acquired", res(r), winner.Owner, winner.Token, o.lease.Owner, o.lease.Token)
				}
				winner = &o.lease
			}
		}
		if winner == nil {
			s.t.Fatalf("%s: nobody acquired", res(r))
		}
		for w := range workers {
			o := results[w][r]
			if o.err == nil {
				continue
			}
			var held *fencing.LeaseHeldError
			if !errors.As(o.err, &held) {
				s.t.Fatalf("%s: w%d got %v, want success or *LeaseHeldError", res(r), w, o.err)
			}
			if held.Holder != winner.Owner {
				s.t.Fatalf("%s: w%d told holder %q, but %q won", res(r), w, held.Holder, winner.Owner)
			}
		}
		st := s.status(res(r))
		s.wantLeaseIs(res(r)+" after the race", st.Lease, *winner)
		if st.Issued != winner.Token {
			s.t.Fatalf("%s: issued %d after one acquisition with token %d", res(r), st.Issued, winner.Token)
		}
	}
}

func testConcurrentAcquireReleaseUniqueTokens(s *suite) {
	const workers, resources, rounds = 16, 3, 4
	res := func(r int) string { return fmt.Sprintf("race:cycle:%d", r) }
	type got struct {
		resource int
		token    fencing.Token
		err      error
	}
	results := make([][]got, workers)
	var start, done sync.WaitGroup
	start.Add(1)
	for w := range workers {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			owner := fmt.Sprintf("w%d", w)
			for i := range rounds * resources {
				r := (w + i) % resources
				l, err := s.st.Acquire(s.ctx, fencing.AcquireRequest{Resource: res(r), Owner: owner, TTL: longTTL})
				if errors.Is(err, fencing.ErrLeaseHeld) {
					continue
				}
				if err != nil {
					results[w] = append(results[w], got{r, 0, fmt.Errorf("Acquire: %w", err)})
					return
				}
				ok, err := s.st.Release(s.ctx, fencing.ReleaseRequest{Resource: res(r), Owner: owner, Token: l.Token})
				if err == nil && !ok {
					err = errors.New("Release of a live lease reported false")
				}
				results[w] = append(results[w], got{r, l.Token, err})
				if err != nil {
					return
				}
			}
		}()
	}
	start.Done()
	done.Wait()
	seen := make([]map[fencing.Token]string, resources)
	for r := range seen {
		seen[r] = map[fencing.Token]string{}
	}
	for w, rs := range results {
		for _, g := range rs {
			if g.err != nil {
				s.t.Fatalf("w%d on %s: %v", w, res(g.resource), g.err)
			}
			if prev, dup := seen[g.resource][g.token]; dup {
				s.t.Fatalf("%s: token %d issued to both %s and w%d", res(g.resource), g.token, prev, w)
			}
			seen[g.resource][g.token] = fmt.Sprintf("w%d", w)
		}
	}
	for r := range resources {
		var top fencing.Token
		for tok := range seen[r] {
			top = max(top, tok)
		}
		if len(seen[r]) == 0 {
			s.t.Fatalf("%s: no acquisition succeeded", res(r))
		}
		st := s.status(res(r))
		if st.Issued != top || st.Lease != nil {
			s.t.Fatalf("%s: status %+v after %d acquisitions, want issued %d and no lease", res(r), st, len(seen[r]), top)
		}
	}
}

func testConcurrentAdmitNeverLowers(s *suite) {
	const res = "race:admit"
	const workers, calls = 16, 24
	top := s.issue(res, 8).Token
	type got struct {
		token fencing.Token
		adm   fencing.Admission
		err   error
	}
	results := make([][]got, workers)
	var start, done sync.WaitGroup
	start.Add(1)
	for w := range workers {
		done.Add(1)
		go func() {
			defer done.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			start.Wait()
			for range calls {
				// Mostly near the top, so raises and stale refusals mix.
				tok := top - fencing.Token(rng.IntN(int(min(top, 8))))
				a, err := s.st.Admit(s.ctx, fencing.AdmitRequest{Resource: res, Token: tok})
				results[w] = append(results[w], got{tok, a, err})
			}
		}()
	}
	start.Done()
	done.Wait()
	var admittedTop fencing.Token
	for w, rs := range results {
		var mine fencing.Token // the highest token this worker saw admitted
		for i, g := range rs {
			if g.err == nil {
				if g.token < mine {
					s.t.Fatalf("w%d call %d: token %d admitted after %d was: the mark went down", w, i, g.token, mine)
				}
				if g.adm.HighWater != g.token || g.adm.Token != g.token {
					s.t.Fatalf("w%d call %d: admission %+v, want high water %d", w, i, g.adm, g.token)
				}
				mine = g.token
				admittedTop = max(admittedTop, g.token)
				continue
			}
			var stale *fencing.StaleTokenError
			if !errors.As(g.err, &stale) {
				s.t.Fatalf("w%d call %d: Admit(%d): %v, want success or *StaleTokenError", w, i, g.token, g.err)
			}
			if stale.HighWater <= g.token || stale.HighWater < mine {
				s.t.Fatalf("w%d call %d: stale refusal of %d reports high water %d (worker saw %d admitted)", w, i, g.token, stale.HighWater, mine)
			}
		}
	}
	if admittedTop == 0 {
		s.t.Fatal("no admission succeeded")
	}
	s.wantMarks(res, top, admittedTop)
}
