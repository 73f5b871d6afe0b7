package boltstore_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"pgregory.net/rapid"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/fencingtest/linear"
)

// testMaxCheckpointBytes is small so the oversize cases stay cheap.
const testMaxCheckpointBytes = 4 << 10

func open(t testing.TB, path string, opts boltstore.Options) *boltstore.Store {
	t.Helper()
	st, err := boltstore.Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return st
}

// testRetention is the retention of the suite's stores, on the fake clock.
const testRetention = time.Hour

// harness opens each store in its own file; Reopen closes it and opens the
// same file again with the same clock, as a restart would. Backup copies
// the file, and the lineage marker beside it when withMarker (a restore
// the store cannot detect: only its tokens on the clock protect it) or not
// (a restore it detects as a loss).
func harness(maxState int, withMarker bool) fencingtest.Harness {
	return fencingtest.Harness{
		MaxCheckpointBytes: maxState,
		Open: func(t testing.TB) fencingtest.Instance {
			clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
			path := filepath.Join(t.TempDir(), "fencegate.db")
			// The background sweep stays out of the way (a day between
			// passes): the cases sweep when they mean to.
			opts := boltstore.Options{Clock: clock, MaxCheckpointBytes: maxState, Retention: testRetention, SweepInterval: 24 * time.Hour}
			st := open(t, path, opts)
			t.Cleanup(func() { st.Close() })
			reopen := func(t testing.TB) fencing.Store {
				t.Helper()
				if err := st.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				st = open(t, path, opts)
				return st
			}
			return fencingtest.Instance{
				Store:       st,
				Advance:     clock.Advance,
				Rewind:      clock.Rewind,
				Reopen:      reopen,
				ClockTokens: true,
				Retention:   testRetention,
				Sweep:       func(ctx context.Context) (int, error) { return st.Sweep(ctx) },
				Delete: func(t testing.TB, res string) {
					t.Helper()
					if err := boltstore.DeleteRecord(st, res); err != nil {
						t.Fatalf("DeleteRecord: %v", err)
					}
				},
				Backup: func(t testing.TB) func(t testing.TB) fencing.Store {
					t.Helper()
					var db bytes.Buffer
					if err := st.Backup(&db); err != nil {
						t.Fatalf("Backup: %v", err)
					}
					marker, err := os.ReadFile(path + ".lineage")
					if err != nil {
						t.Fatal(err)
					}
					return func(t testing.TB) fencing.Store {
						t.Helper()
						if err := st.Close(); err != nil {
							t.Fatalf("Close: %v", err)
						}
						if err := os.WriteFile(path, db.Bytes(), 0o600); err != nil {
							t.Fatal(err)
						}
						if withMarker {
							if err := os.WriteFile(path+".lineage", marker, 0o600); err != nil {
								t.Fatal(err)
							}
						}
						st = open(t, path, opts)
						return st
					}
				},
			}
		},
	}
}

func TestConformance(t *testing.T) {
	fencingtest.Run(t, harness(testMaxCheckpointBytes, true))
}

// TestRestoreDetected restores the file without its marker: the store
// detects the loss and moves past every token (the suite's restore case).
func TestRestoreDetected(t *testing.T) {
	fencingtest.RunCase(t, harness(testMaxCheckpointBytes, false), "RestoreFromOlderCopy")
}

// TestConformanceDefaultLimit runs the suite at the default 1 MiB state
// limit, the one production uses.
func TestConformanceDefaultLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	fencingtest.Run(t, harness(0, true))
}

// TestRestartKeepsLiveLease restarts over the same file on the host's
// clock: a live lease stays live (its expiry is a wall-clock instant), its
// holder keeps working with its token, and tokens keep increasing.
func TestRestartKeepsLiveLease(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fencegate.db")
	st := open(t, path, boltstore.Options{})
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "job:1", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = open(t, path, boltstore.Options{})
	defer st.Close()
	status, err := st.Status(ctx, "job:1")
	if err != nil {
		t.Fatal(err)
	}
	if status.Lease == nil || status.Lease.Owner != "alice" || status.Lease.Token != l.Token || !status.Lease.ExpiresAt.Equal(l.ExpiresAt) {
		t.Fatalf("after restart status lease %+v, want %+v", status.Lease, l)
	}
	if status.Issued != l.Token || status.HighWater != l.Token {
		t.Fatalf("after restart issued %d high water %d, want %d", status.Issued, status.HighWater, l.Token)
	}
	var held *fencing.LeaseHeldError
	if _, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "bob", TTL: time.Minute}); !errors.As(err, &held) || held.Holder != "alice" {
		t.Fatalf("Acquire by another owner after restart: %v, want held by alice", err)
	}
	if _, err := st.Renew(ctx, fencing.RenewRequest{Resource: "job:1", Owner: "alice", Token: l.Token}); err != nil {
		t.Fatalf("holder's Renew after restart: %v", err)
	}
	if ok, err := st.Release(ctx, fencing.ReleaseRequest{Resource: "job:1", Owner: "alice", Token: l.Token}); err != nil || !ok {
		t.Fatalf("holder's Release after restart = %v, %v", ok, err)
	}
	l2, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "bob", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token <= l.Token {
		t.Fatalf("token after restart %d, want > %d", l2.Token, l.Token)
	}
}

// TestRestartAfterDowntimeExpires restarts with the clock moved past the
// lease's expiry (fencegate was down longer than the TTL): the lease is
// expired, and the history says so.
func TestRestartAfterDowntimeExpires(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "fencegate.db")
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	st := open(t, path, boltstore.Options{Clock: fencingtest.NewFakeClock(start)})
	l, err := st.Acquire(ctx, fencing.AcquireRequest{Resource: "job:1", Owner: "alice", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = open(t, path, boltstore.Options{Clock: fencingtest.NewFakeClock(start.Add(time.Minute))})
	defer st.Close()
	status, err := st.Status(ctx, "job:1")
	if err != nil {
		t.Fatal(err)
	}
	if status.Lease != nil || status.Previous == nil || status.Previous.Ended != fencing.EndExpired || status.Previous.Token != l.Token {
		t.Fatalf("after downtime status %+v, want the lease expired", status)
	}
	if _, err := st.Renew(ctx, fencing.RenewRequest{Resource: "job:1", Owner: "alice", Token: l.Token}); !errors.Is(err, fencing.ErrLeaseLost) {
		t.Fatalf("Renew after downtime: %v, want ErrLeaseLost", err)
	}
}

func TestClosedStoreUnavailable(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err := st.Admit(ctx, fencing.AdmitRequest{Resource: "a", Token: 1})
	if !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Admit on a closed store: %v, want ErrUnavailable", err)
	}
	_, err = st.Acquire(ctx, fencing.AcquireRequest{Resource: "a", Owner: "o", TTL: time.Second})
	if !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Acquire on a closed store: %v, want ErrUnavailable", err)
	}
	if err := st.Ping(ctx); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("Ping on a closed store: %v, want ErrUnavailable", err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestOpenRefusesBadOptions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegate.db")
	for _, opts := range []boltstore.Options{{Timeout: -time.Second}, {MaxCheckpointBytes: -1}} {
		if st, err := boltstore.Open(path, opts); err == nil {
			st.Close()
			t.Fatalf("Open with %+v succeeded", opts)
		}
	}
	// A file that is not a bbolt database is refused, not overwritten.
	junk := filepath.Join(t.TempDir(), "junk.db")
	if err := os.WriteFile(junk, []byte(strings.Repeat("not a database\n", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := boltstore.Open(junk, boltstore.Options{}); err == nil {
		st.Close()
		t.Fatal("Open of a junk file succeeded")
	} else if !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), junk) {
		t.Fatalf("Open of a junk file: %v, want ErrUnavailable naming the file", err)
	}
}

// TestOpenRefusesOtherFormatVersion: a file stamped with another layout
// version (a future fencegate's) is refused, not misread or rewritten.
func TestOpenRefusesOtherFormatVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegate.db")
	open(t, path, boltstore.Options{}).Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("format"), []byte("2"))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if st, err := boltstore.Open(path, boltstore.Options{}); err == nil {
		st.Close()
		t.Fatal("Open of a file with format version 2 succeeded")
	} else if !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"2"`) {
		t.Fatalf("Open of a file with format version 2: %v, want ErrUnavailable naming the file and the version", err)
	}
}

// lockHolderEnv makes the test binary, run as a child, hold the store file
// open until its stdin closes.
const lockHolderEnv = "FENCEGATE_BOLTSTORE_TEST_HOLD"

// TestHelperHoldLock is the child process of TestOpenLockedByAnotherProcess.
func TestHelperHoldLock(t *testing.T) {
	path := os.Getenv(lockHolderEnv)
	if path == "" {
		t.Skip("helper process for TestOpenLockedByAnotherProcess")
	}
	st, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	os.Stdout.WriteString("holding\n")
	bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
}

func TestOpenLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegate.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldLock$", "-test.count=1")
	cmd.Env = append(os.Environ(), lockHolderEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "holding\n" {
		t.Fatalf("helper did not take the lock: %q, %v", line, err)
	}

	st, err := boltstore.Open(path, boltstore.Options{Timeout: 200 * time.Millisecond})
	if err == nil {
		st.Close()
		t.Fatal("Open succeeded while another process holds the file")
	}
	if !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open of a locked file: %v, want ErrUnavailable naming %s", err, path)
	}

	// Once the holder exits, the file opens.
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	st = open(t, path, boltstore.Options{})
	st.Close()
}

func BenchmarkStore(b *testing.B) {
	fencingtest.RunBenchmarks(b, fencingtest.Harness{
		Open: func(t testing.TB) fencingtest.Instance {
			st := open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{})
			t.Cleanup(func() { st.Close() })
			return fencingtest.Instance{Store: st}
		},
	})
}

// TestLinearizable checks a concurrent history of random calls against the
// model of one resource, with the fake clock moving under the clients so
// leases expire during the run.
func TestLinearizable(t *testing.T) {
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	// CountFromOne: the model counts from issued 0; a new file's clock
	// floor is checked by the lineage tests.
	st := open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{Clock: clock, CountFromOne: true})
	defer st.Close()
	linear.Check(t, st, linear.Options{Name: "file", Now: clock.Now, Advance: clock.Advance, Ops: linear.SoakOr(1500, 100000)})
	cs := st.CommitStats()
	t.Logf("group commits: %d carrying %d writes", cs.Groups, cs.Calls)
}

// TestStateMachine checks random call sequences against the model of one
// resource, answer by answer, with rapid shrinking any failure.
func TestStateMachine(t *testing.T) {
	dir := t.TempDir()
	var n int
	linear.CheckStateMachine(t, func(rt *rapid.T, clock *fencingtest.FakeClock) fencing.Store {
		n++
		st, err := boltstore.Open(filepath.Join(dir, fmt.Sprintf("sm-%d.db", n)), boltstore.Options{Clock: clock, CountFromOne: true})
		if err != nil {
			rt.Fatal(err)
		}
		return st
	})
}

// TestAdmitAtTheMarkAllocatesNothing: the gate's common admission costs no
// heap allocation (and no transaction).
func TestAdmitAtTheMarkAllocatesNothing(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{})
	defer st.Close()
	fencingtest.CheckAdmitAtTheMarkAllocs(t, st)
}

// TestQuickAdmit: the file store answers an admission at the mark at once,
// from its cache; a raise, which writes the file, is left to Admit.
func TestQuickAdmit(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "fencegate.db"), boltstore.Options{})
	defer st.Close()
	fencingtest.CheckQuickAdmit(t, st, false)
}
