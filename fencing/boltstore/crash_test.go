package boltstore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
)

// The SIGKILL durability test: a child process (this test binary) runs
// crashWorkers workers against a store file, each cycling over its own
// crashResources resources through acquire, raise (an admission that
// moves the mark), renew, checkpoint and release, and prints one line per
// operation once the store has answered it: the acknowledgement. The
// parent kills the child with SIGKILL after a random number of
// acknowledgements, opens the file itself, and checks that everything
// acknowledged is there: every acquired token issued, every raised mark
// raised, every live lease live with its token, every release released,
// every checkpoint saved; that the operation a worker had in flight is
// either wholly there or wholly absent; that the file is not taken for a
// lost one; and, over all rounds, that every token acknowledged for a
// resource is above every token known for it before (tokens only rise).
// Then it releases the leases left live and starts the next child on the
// same file. The test waits on counts of acknowledgements, never on time,
// so a busy machine makes it slower, not flaky.

const (
	crashChildEnv  = "FENCEGATE_BOLTSTORE_TEST_CRASH"
	crashRoundsEnv = "FENCEGATE_CRASH_ROUNDS"
	crashWorkers   = 16
	crashResources = 3
)

func crashRes(w, i int) string { return fmt.Sprintf("crash:%d:%d", w, i) }
func crashOwner(w int) string  { return fmt.Sprintf("w%d", w) }
func crashState(t fencing.Token) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"t":%d}`, t))
}

// TestHelperCrashChild is the child process of TestSIGKILLLosesNothing.
func TestHelperCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("helper process for TestSIGKILLLosesNothing")
	}
	st, err := boltstore.Open(path, boltstore.Options{Timeout: time.Minute})
	if err != nil {
		fmt.Printf("ERR open: %v\n", err)
		os.Exit(1)
	}
	if why := st.LossDetected(); why != "" {
		fmt.Printf("ERR loss detected at open: %s\n", why)
		os.Exit(1)
	}
	var out sync.Mutex
	ack := func(w, i int, kind string, tok fencing.Token) {
		line := fmt.Sprintf("%d %d %s %d\n", w, i, kind, tok)
		out.Lock()
		os.Stdout.WriteString(line) // one write: the acknowledgement
		out.Unlock()
	}
	fail := func(format string, args ...any) {
		out.Lock()
		fmt.Printf("ERR "+format+"\n", args...)
		os.Exit(1)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range crashWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := crashOwner(w)
			for cycle := 0; ; cycle++ {
				i := cycle % crashResources
				res := crashRes(w, i)
				l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Hour})
				if err != nil {
					fail("acquire %s: %v", res, err)
				}
				ack(w, i, "acq", l.Token)
				if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token}); err != nil {
					fail("admit %s %d: %v", res, l.Token, err)
				}
				ack(w, i, "raise", l.Token)
				if _, err := st.Renew(ctx, fencing.RenewRequest{Resource: res, Owner: owner, Token: l.Token, TTL: 2 * time.Hour}); err != nil {
					fail("renew %s: %v", res, err)
				}
				ack(w, i, "renew", l.Token)
				if _, err := st.Checkpoint(ctx, fencing.CheckpointRequest{Resource: res, Owner: owner, Token: l.Token, State: crashState(l.Token)}); err != nil {
					fail("checkpoint %s: %v", res, err)
				}
				ack(w, i, "ckpt", l.Token)
				if ok, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: owner, Token: l.Token}); err != nil || !ok {
					fail("release %s: %v, %v", res, ok, err)
				}
				ack(w, i, "rel", l.Token)
			}
		}()
	}
	wg.Wait()
}

// crashModel is what the parent knows of one resource from the
// acknowledgements and the checks of earlier rounds.
type crashModel struct {
	issued   fencing.Token // highest token known issued
	raised   fencing.Token // highest mark known raised
	live     bool          // a lease acknowledged and not released
	liveTok  fencing.Token
	ckptTok  fencing.Token // token of the last checkpoint known saved; 0: none
	lastKind string        // the last acknowledged operation, "" this round: none
}

// successor is the operation a worker runs after kind.
var successor = map[string]string{"": "acq", "acq": "raise", "raise": "renew", "renew": "ckpt", "ckpt": "rel", "rel": "acq"}

func TestSIGKILLLosesNothing(t *testing.T) {
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	if v, err := strconv.Atoi(os.Getenv(crashRoundsEnv)); err == nil && v > 0 {
		rounds = v
	}
	path := filepath.Join(t.TempDir(), "fencegate.db")
	model := map[string]*crashModel{}
	for w := range crashWorkers {
		for i := range crashResources {
			model[crashRes(w, i)] = &crashModel{}
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 31))
	total := 0
	for round := range rounds {
		// last[w] is worker w's last acknowledged operation this round:
		// its successor is the one it may have had in flight.
		type last struct {
			i    int
			kind string
		}
		lasts := make([]last, crashWorkers)
		for r := range model {
			model[r].lastKind = ""
		}
		killAfter := 1 + rng.IntN(600)
		acks := runCrashChild(t, path, killAfter, rng)
		for _, a := range acks {
			res := crashRes(a.w, a.i)
			m := model[res]
			if want := successor[lasts[a.w].kind]; a.kind != want {
				t.Fatalf("round %d: worker %d acknowledged %s after %s, want %s", round, a.w, a.kind, lasts[a.w].kind, want)
			}
			switch a.kind {
			case "acq":
				if a.tok <= m.issued {
					t.Fatalf("round %d: %s acquired with token %d, not above %d known before: tokens must only rise", round, res, a.tok, m.issued)
				}
				m.issued, m.live, m.liveTok = a.tok, true, a.tok
			case "raise":
				m.raised = max(m.raised, a.tok)
			case "ckpt":
				m.ckptTok = a.tok
			case "rel":
				m.live = false
			}
			m.lastKind = a.kind
			lasts[a.w] = last{a.i, a.kind}
		}
		total += len(acks)

		st := open(t, path, boltstore.Options{})
		if why := st.LossDetected(); why != "" {
			t.Fatalf("round %d: after SIGKILL the file was taken for a lost one: %s", round, why)
		}
		for w := range crashWorkers {
			// The operation worker w may have had in flight, and where.
			kind := successor[lasts[w].kind]
			i := lasts[w].i
			if lasts[w].kind == "rel" {
				i = (i + 1) % crashResources
			} else if lasts[w].kind == "" {
				i = 0
			}
			for j := range crashResources {
				inflight := ""
				if j == i {
					inflight = kind
				}
				checkCrashResource(t, st, round, w, j, model[crashRes(w, j)], inflight)
			}
		}
		closeStore(t, st)
	}
	t.Logf("%d rounds, %d acknowledged operations checked after SIGKILL", rounds, total)
}

// checkCrashResource checks one resource against the model after a kill,
// allowing the operation in flight (if any, on this resource) to be there
// or not; it then releases a lease left live and updates the model to what
// the store holds, for the next round.
func checkCrashResource(t *testing.T, st *boltstore.Store, round, w, i int, m *crashModel, inflight string) {
	t.Helper()
	ctx := context.Background()
	res := crashRes(w, i)
	s, err := st.Status(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("round %d: %s (last acknowledged %q, in flight %q): %s; status %+v", round, res, m.lastKind, inflight, fmt.Sprintf(format, args...), s)
	}
	if s.Issued < m.issued {
		fail("issued %d, below the acknowledged %d", s.Issued, m.issued)
	}
	if s.HighWater < m.raised {
		fail("high water %d, below the acknowledged raise %d", s.HighWater, m.raised)
	}
	if s.Issued > m.issued && inflight != "acq" {
		fail("issued %d, above every token acquired (%d) with no acquisition in flight", s.Issued, m.issued)
	}
	switch {
	case inflight == "acq" && s.Lease != nil:
		if s.Lease.Owner != crashOwner(w) || s.Lease.Token <= m.issued || s.Lease.Token != s.Issued {
			fail("the in-flight acquisition left lease %+v", s.Lease)
		}
	case inflight == "rel" && s.Lease == nil:
		if s.Previous == nil || s.Previous.Token != m.liveTok || s.Previous.Ended != fencing.EndReleased {
			fail("the in-flight release left previous %+v", s.Previous)
		}
	case m.live:
		if s.Lease == nil || s.Lease.Token != m.liveTok || s.Lease.Owner != crashOwner(w) {
			fail("the acknowledged lease with token %d is not live", m.liveTok)
		}
	case s.Lease != nil:
		fail("a lease is live after its release was acknowledged")
	}
	if m.ckptTok != 0 || (inflight == "ckpt" && s.Checkpoint != nil) {
		ok := s.Checkpoint != nil && (s.Checkpoint.Token == m.ckptTok || inflight == "ckpt" && s.Checkpoint.Token == m.liveTok)
		if !ok {
			fail("checkpoint %+v, want the one saved with token %d", s.Checkpoint, m.ckptTok)
		}
		cp, err := st.ReadCheckpoint(ctx, res)
		if err != nil || string(cp.State) != string(crashState(s.Checkpoint.Token)) {
			fail("checkpoint state %s, %v; want %s", cp.State, err, crashState(s.Checkpoint.Token))
		}
	}

	// The next round starts from what the store holds.
	m.issued, m.raised, m.live = s.Issued, s.HighWater, false
	if s.Checkpoint != nil {
		m.ckptTok = s.Checkpoint.Token
	}
	if s.Lease != nil {
		if ok, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: s.Lease.Owner, Token: s.Lease.Token}); err != nil || !ok {
			t.Fatalf("round %d: release %s for the next round: %v, %v", round, res, ok, err)
		}
	}
}

type crashAck struct {
	w, i int
	kind string
	tok  fencing.Token
}

// runCrashChild starts the child on path, kills it with SIGKILL once it has
// acknowledged killAfter operations (and a random sliver of time more, to
// vary the moment against the commits in flight), and returns every
// acknowledgement it printed before it died.
func runCrashChild(t *testing.T, path string, killAfter int, rng *rand.Rand) []crashAck {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, stdout)
	}()
	var acks []crashAck
	parse := func(line string) {
		t.Helper()
		var a crashAck
		if _, err := fmt.Sscanf(line, "%d %d %s %d", &a.w, &a.i, &a.kind, &a.tok); err != nil {
			cmd.Process.Kill()
			t.Fatalf("child said %q (%v); stderr:\n%s", line, err, stderr.String())
		}
		acks = append(acks, a)
	}
	killed := false
	for line := range lines {
		if strings.HasPrefix(line, "ERR") || strings.HasPrefix(line, "---") || strings.HasPrefix(line, "PASS") || strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "ok") {
			if !strings.HasPrefix(line, "ERR") {
				continue
			}
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child: %s\nstderr:\n%s", line, stderr.String())
		}
		parse(line)
		if !killed && len(acks) >= killAfter {
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("child ended before it was killed, after %d acknowledgements: %v\nstderr:\n%s", len(acks), err, stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL\nstderr:\n%s", err, stderr.String())
	}
	return acks
}
