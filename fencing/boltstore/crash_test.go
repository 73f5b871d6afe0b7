package boltstore_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
)

// TestHelperStorm is not a test: TestKillMidStorm runs it in a child
// process, which writes to the store file named by FENCEGATE_STORM_FILE
// from several goroutines until it is killed, and prints every answer it
// got: "L res token" (a lease acquired), "A res token" (admitted), "R res
// token" (released).
func TestHelperStorm(t *testing.T) {
	path := os.Getenv("FENCEGATE_STORM_FILE")
	if path == "" {
		t.Skip("helper process")
	}
	st, err := boltstore.Open(path, boltstore.Options{Retention: time.Hour})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(op, res string, tok fencing.Token) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "%s %s %d\n", op, res, tok)
		out.Flush()
	}
	ctx := context.Background()
	for w := range 4 {
		go func() {
			for i := 0; ; i++ {
				// One owner per resource, in every child: a lease kept live
				// by an earlier child is taken again (extended, same
				// token), so the storm never runs out of resources.
				res := fmt.Sprintf("storm:%d:%d", w, i%5)
				l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "owner-" + res, TTL: time.Hour})
				if err != nil {
					continue
				}
				say("L", res, l.Token)
				if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token}); err == nil {
					say("A", res, l.Token)
				}
				if i%3 == 0 {
					continue // keep this lease live until its resource comes round again
				}
				if ok, err := st.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: l.Owner, Token: l.Token}); err == nil && ok {
					say("R", res, l.Token)
				}
			}
		}()
	}
	select {}
}

// TestKillMidStorm kills a process writing to the store file with SIGKILL,
// at a random moment of a write storm, many times over the same file: each
// restart finds the file whole (no loss judged), with every lease the
// child was told it holds still live with its token and every admitted
// token's mark kept.
func TestKillMidStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("short: starts child processes")
	}
	path := filepath.Join(t.TempDir(), "fencegate.db")
	live := map[string]fencing.Token{}  // resource -> live lease's token, as told
	marks := map[string]fencing.Token{} // resource -> highest admitted token
	for round := range 12 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStorm$", "-test.count=1")
		cmd.Env = append(os.Environ(), "FENCEGATE_STORM_FILE="+path)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill after a random number of answers, so the kill lands
		// anywhere in the commit path.
		killAt := 50 + rand.IntN(400)
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// apply records one answer the child got.
		apply := func(line string) {
			var op, res string
			var tok fencing.Token
			if _, err := fmt.Sscanf(line, "%s %s %d", &op, &res, &tok); err != nil {
				t.Errorf("round %d: child said %q", round, line)
				return
			}
			switch op {
			case "L":
				live[res] = tok
			case "A":
				marks[res] = max(marks[res], tok)
			case "R":
				if live[res] == tok {
					delete(live, res)
				}
			}
		}
		n := 0
	read:
		for n < killAt {
			select {
			case line, ok := <-lines:
				if !ok {
					break read
				}
				apply(line)
				n++
			case <-time.After(time.Minute): // a hang, not a slow machine
				break read
			}
		}
		cmd.Process.Kill()
		// What the child got before it died counts too.
		for line := range lines {
			apply(line)
		}
		cmd.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if n < killAt {
			t.Fatalf("round %d: the child stopped after %d answers", round, n)
		}

		st := open(t, path, boltstore.Options{})
		if reason := st.LossDetected(); reason != "" {
			st.Close()
			t.Fatalf("round %d: restart after kill -9 judged a loss: %s", round, reason)
		}
		ctx := context.Background()
		for res, tok := range live {
			s, err := st.Status(ctx, res)
			if err != nil || s.Lease == nil || s.Lease.Token != tok {
				st.Close()
				t.Fatalf("round %d: %s after restart: %+v, %v; want the live lease %d", round, res, s, err, tok)
			}
		}
		for res, tok := range marks {
			s, err := st.Status(ctx, res)
			if err != nil || s.HighWater < tok {
				st.Close()
				t.Fatalf("round %d: %s after restart: mark %d, %v; want at least %d", round, res, s.HighWater, err, tok)
			}
		}
		closeStore(t, st)
	}
	if len(live) == 0 || len(marks) == 0 {
		t.Fatalf("the storms left no live lease (%d) or mark (%d) to check", len(live), len(marks))
	}
}
