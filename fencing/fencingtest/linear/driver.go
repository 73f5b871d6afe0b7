package linear

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/fencegate/fencegate/fencing"
)

// Options configure a workload and its check. The zero value is a small
// run against a store on this host's clock.
type Options struct {
	// Name labels the run in logs and artifact file names.
	Name string
	// Clients is the number of concurrent clients; default 6.
	Clients int
	// Resources is the number of resources they share; default 3.
	Resources int
	// Owners is the number of owner names per resource the clients act
	// as (several clients may act as one owner at once); default 3.
	Owners int
	// Ops is the number of calls in the history; default 1500.
	Ops int
	// GapEvery, when set, makes the clients pause together after every
	// GapEvery calls, with no call in flight, for a random time between
	// Gap/4 and Gap.
	// Stores on a real clock need it, so that leases expire during a run
	// (clients that keep calling keep extending them): choose Gap above
	// the longest TTL, so some leases expire in a gap and some do not.
	// With a fake clock use Advance instead.
	GapEvery int
	Gap      time.Duration
	// RoundOps splits longer runs into rounds of this many calls, each on
	// fresh resources and checked on its own; default 5000.
	RoundOps int
	// Prefix starts every resource name, so runs on a shared store do not
	// meet; default "lin".
	Prefix string
	// TTLs are the lease durations the clients ask for; default 1 s, 2 s
	// and 3 s, so that leases expire during a run on a real clock.
	TTLs []time.Duration
	// Now reads the store's clock. Default time.Now: right for stores
	// whose clock is this host's (the memory and file stores on the
	// system clock, a Valkey or PostgreSQL server on this host).
	Now func() time.Time
	// Advance, when set, moves the store's (fake) clock: before about one
	// call in eight a client advances it by up to Step, so leases expire
	// while other calls are in flight.
	Advance func(time.Duration)
	// Step is the largest single Advance; default 300 ms.
	Step time.Duration
	// SkipTokens: the store's new tokens may skip ahead of issued+1 (the
	// Valkey store's follow the server's clock in µs).
	SkipTokens bool
	// Nemesis, when set, runs on the calling goroutine while the clients
	// run (so it may call t.Fatal), injecting faults until stop is closed;
	// it must heal before it returns, and returns how many faults of each
	// kind it injected. It runs once per round.
	Nemesis func(stop <-chan struct{}) map[string]int
	// Weights are the relative frequencies of the operations, indexed by
	// Kind; zero means the default mix.
	Weights [7]int
	// Seed makes the workload's choices repeatable; 0 picks one (logged).
	Seed uint64
	// CheckBudget bounds the linearizability check; default 2 minutes.
	CheckBudget time.Duration
	// ArtifactDir receives the HTML view of a counterexample and the whole
	// history as JSON; default
	// $FENCEGATE_LINEARIZABILITY_DIR, else $TMPDIR/fencegate-linearizability.
	ArtifactDir string
}

var defaultWeights = [7]int{Acquire: 24, Renew: 12, Release: 12, Checkpoint: 10, ReadCheckpoint: 6, Status: 14, Admit: 22}

func (o *Options) fill() {
	if o.Name == "" {
		o.Name = "store"
	}
	if o.Clients <= 0 {
		o.Clients = 6
	}
	if o.Resources <= 0 {
		o.Resources = 3
	}
	if o.Owners <= 0 {
		o.Owners = 3
	}
	if o.Ops <= 0 {
		o.Ops = 1500
	}
	if o.RoundOps <= 0 {
		o.RoundOps = 5000
	}
	if o.Prefix == "" {
		o.Prefix = "lin"
	}
	if len(o.TTLs) == 0 {
		o.TTLs = []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Step <= 0 {
		o.Step = 300 * time.Millisecond
	}
	if o.Weights == ([7]int{}) {
		o.Weights = defaultWeights
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	if o.CheckBudget <= 0 {
		o.CheckBudget = 2 * time.Minute
	}
	if o.ArtifactDir == "" {
		o.ArtifactDir = DefaultArtifactDir()
	}
}

// DefaultArtifactDir is $FENCEGATE_LINEARIZABILITY_DIR, else
// $TMPDIR/fencegate-linearizability: a place that outlives the test, unlike
// t.TempDir.
func DefaultArtifactDir() string {
	if d := os.Getenv("FENCEGATE_LINEARIZABILITY_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "fencegate-linearizability")
}

// Soak reports whether FENCEGATE_SOAK=1 asks for the long runs.
func Soak() bool { return os.Getenv("FENCEGATE_SOAK") == "1" }

// Report summarizes a checked run.
type Report struct {
	Name                            string
	Ops, Rounds, Resources, Clients int
	OK, Refused, Ambiguous, Unavail int
	Faults                          map[string]int // injected faults by kind
	Seed                            uint64
	Elapsed                         time.Duration // recording and checking
	Verdict                         Verdict       // of the last round checked
}

func (r Report) String() string {
	faults := "none"
	if len(r.Faults) > 0 {
		var parts []string
		for k, n := range r.Faults {
			parts = append(parts, fmt.Sprintf("%s ×%d", k, n))
		}
		sort.Strings(parts)
		faults = strings.Join(parts, ", ")
	}
	return fmt.Sprintf("%s: %d calls in %d round(s) on %d resources each by %d clients (ok %d, refused %d, ambiguous %d, unavailable %d), faults: %s, seed %d, %v: %s",
		r.Name, r.Ops, r.Rounds, r.Resources, r.Clients, r.OK, r.Refused, r.Ambiguous, r.Unavail, faults, r.Seed, r.Elapsed.Round(time.Millisecond), r.Verdict.Result)
}

// Check runs the workload against st, checks the history, and fails t
// unless it is linearizable: it then prints the shortest counterexample and
// the paths of its HTML view and of the whole history. Answers that match
// no sentinel of fencing.Store fail t too. Runs longer than
// Options.RoundOps calls are split into rounds on fresh resources, each
// checked on its own (so a soak's check stays fast). It returns the run's
// report (also logged).
func Check(t testing.TB, st fencing.Store, opts Options) Report {
	t.Helper()
	opts.fill()
	start := time.Now()
	r := Report{Name: opts.Name, Resources: opts.Resources, Clients: opts.Clients, Seed: opts.Seed, Faults: map[string]int{}}
	for left := opts.Ops; left > 0; left -= opts.RoundOps {
		o := opts
		o.Ops = min(left, opts.RoundOps)
		if opts.Ops > opts.RoundOps {
			o.Prefix = fmt.Sprintf("%s-r%d", opts.Prefix, r.Rounds)
			o.Seed = opts.Seed + uint64(r.Rounds)
		}
		r.Rounds++
		h, faults := Record(st, o)
		for k, n := range faults {
			r.Faults[k] += n
		}
		ops := h.Operations()
		r.Ops += len(ops)
		ok, refused, ambiguous, unavail := h.Counts()
		r.OK, r.Refused, r.Ambiguous, r.Unavail = r.OK+ok, r.Refused+refused, r.Ambiguous+ambiguous, r.Unavail+unavail
		for _, u := range h.Unexpected() {
			t.Errorf("an answer matched no sentinel error of fencing.Store: %s", u)
		}
		r.Verdict = CheckHistory(ops, o.SkipTokens, o.CheckBudget, o.ArtifactDir, o.Name)
		if r.Verdict.Result != porcupine.Ok {
			break
		}
	}
	r.Elapsed = time.Since(start)
	t.Log(r.String())
	switch v := r.Verdict; v.Result {
	case porcupine.Illegal:
		t.Errorf("%s: the history is NOT linearizable (round %d, seed %d)\n%s", opts.Name, r.Rounds, opts.Seed, v.Counterexample)
		if v.Artifact != "" {
			t.Errorf("HTML view of the counterexample: %s", v.Artifact)
		}
		if v.HistoryFile != "" {
			t.Errorf("the whole history (linear.LoadHistory): %s", v.HistoryFile)
		}
	case porcupine.Unknown:
		t.Errorf("%s: the check did not finish within %v (round %d, seed %d); shorten the history", opts.Name, opts.CheckBudget, r.Rounds, opts.Seed)
	}
	return r
}

// knowledge is what the clients learnt of one resource's tokens: the
// tokens answers showed, and each owner's newest lease token.
type knowledge struct {
	mu      sync.Mutex
	seen    []fencing.Token
	byOwner map[string]fencing.Token
}

func (k *knowledge) learn(owner string, toks ...fencing.Token) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, t := range toks {
		if t != 0 {
			k.seen = append(k.seen, t)
		}
	}
	if owner != "" && len(toks) == 1 && toks[0] != 0 {
		k.byOwner[owner] = toks[0]
	}
}

func (k *knowledge) hasSeen() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.seen) > 0
}

// token picks a token to present as owner: mostly the owner's own newest
// lease token, else one the clients have seen.
func (k *knowledge) token(rng *rand.Rand, owner string) fencing.Token {
	k.mu.Lock()
	defer k.mu.Unlock()
	if t, ok := k.byOwner[owner]; ok && rng.IntN(10) < 7 {
		return t
	}
	if len(k.seen) == 0 {
		return 1
	}
	return k.seen[rng.IntN(len(k.seen))]
}

// Record runs the workload against st and returns its history and the
// faults the nemesis injected. The clients stop after
// opts.Ops calls.
func Record(st fencing.Store, opts Options) (*History, map[string]int) {
	opts.fill()
	h := newHistory(opts.SkipTokens)
	names := make([]string, opts.Resources)
	know := make([]*knowledge, opts.Resources)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", opts.Prefix, i)
		know[i] = &knowledge{byOwner: map[string]fencing.Token{}}
	}
	var total int
	for _, w := range opts.Weights {
		total += w
	}
	var budget atomic.Int64
	budget.Store(int64(opts.Ops))
	var seq atomic.Int64
	// Calls hold gap for reading; a gap holds it for writing, so no call
	// is in flight during a gap.
	var gap sync.RWMutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	ctx := context.Background()
	for c := range opts.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(opts.Seed, uint64(c)))
			for {
				left := budget.Add(-1)
				if left < 0 {
					break
				}
				if n := int64(opts.Ops) - left - 1; opts.GapEvery > 0 && opts.Gap > 0 && n > 0 && n%int64(opts.GapEvery) == 0 {
					gap.Lock()
					time.Sleep(opts.Gap/4 + time.Duration(rng.Int64N(int64(opts.Gap)*3/4)))
					gap.Unlock()
				}
				gap.RLock()
				if opts.Advance != nil && rng.IntN(8) == 0 {
					// Time passes between calls and during them (other
					// clients' calls are in flight).
					opts.Advance(time.Duration(rng.Int64N(int64(opts.Step))))
				}
				ri := rng.IntN(len(names))
				in := next(rng, &opts, total, names[ri], know[ri], &seq)
				out := h.invoke(ctx, st, c, opts.Now, in)
				learnFrom(know[ri], in, out)
				gap.RUnlock()
			}
		}()
	}
	var faults map[string]int
	if opts.Nemesis != nil {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		go func() {
			// Stop the nemesis once the clients are done.
			<-done
			close(stop)
		}()
		faults = opts.Nemesis(stop)
		<-done
	} else {
		wg.Wait()
	}
	return h, faults
}

// next draws one call.
func next(rng *rand.Rand, o *Options, total int, res string, k *knowledge, seq *atomic.Int64) Input {
	pick := rng.IntN(total)
	kind := Acquire
	for i, w := range o.Weights {
		if pick < w {
			kind = Kind(i)
			break
		}
		pick -= w
	}
	owner := fmt.Sprintf("w%d", rng.IntN(o.Owners))
	ttl := o.TTLs[rng.IntN(len(o.TTLs))].Milliseconds()
	in := Input{Kind: kind, Resource: res}
	switch kind {
	case Acquire:
		in.Owner, in.TTL = owner, ttl
	case Renew:
		in.Owner, in.Token = owner, k.token(rng, owner)
		if rng.IntN(2) == 0 {
			in.TTL = ttl
		}
	case Release:
		in.Owner, in.Token, in.Finished = owner, k.token(rng, owner), rng.IntN(2) == 0
	case Checkpoint:
		in.Owner, in.Token = owner, k.token(rng, owner)
		in.State = fmt.Sprintf(`{"step":%d}`, seq.Add(1))
	case Admit:
		in.Token, in.RequireLive = admitToken(rng, o.SkipTokens, owner, k), rng.IntN(4) == 0
	}
	return in
}

// admitToken picks a write's token: a holder's, an old one, a forged one
// far above anything issued, and (when tokens are issued+1, so that every
// value up to issued was handed out) the neighbours of seen tokens.
func admitToken(rng *rand.Rand, skip bool, owner string, k *knowledge) fencing.Token {
	switch n := rng.IntN(10); {
	case n == 0 || skip && !k.hasSeen():
		// Forged. With skipping tokens, never a small guess: the Valkey
		// store refuses tokens from before a resource's first one.
		return 1<<60 + fencing.Token(rng.Uint64N(1<<20))
	case n == 1 && !skip:
		t := k.token(rng, owner) + fencing.Token(rng.IntN(3))
		if rng.IntN(2) == 0 && t > 1 {
			t -= 2
		}
		return max(t, 1)
	}
	return k.token(rng, owner)
}

// learnFrom records the tokens an answer shows.
func learnFrom(k *knowledge, in Input, out Output) {
	switch {
	case out.Result == OK && in.Kind == Acquire:
		k.learn(in.Owner, out.Lease.Token)
	case out.Result == OK && in.Kind == Status:
		k.learn("", out.Issued, out.Lease.Token, out.Prev.Token)
	case out.Result == OK && in.Kind == Admit:
		k.learn("", out.Issued)
	case out.Result == Refused && (out.Refusal == StaleToken || out.Refusal == TokenNotIssued):
		k.learn("", out.Mark)
	}
}

// SoakOr is normal, or soak when FENCEGATE_SOAK=1.
func SoakOr(normal, soak int) int {
	if Soak() {
		return soak
	}
	return normal
}
