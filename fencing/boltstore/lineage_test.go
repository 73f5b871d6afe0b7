package boltstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/fencingtest"
)

// lossFixture is a store file that issued and admitted tokens on two
// resources, closed; backup is a copy of the file taken after the first
// resource's first lease.
type lossFixture struct {
	path, backup string
	opts         boltstore.Options
	clock        *fencingtest.FakeClock
	old          fencing.Token // admitted, then superseded by newer
	newer        fencing.Token // the newest token of "job", admitted
	other        fencing.Token // "other"'s token, live at close
}

func newLossFixture(t *testing.T, countFromOne bool) *lossFixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	f := &lossFixture{path: filepath.Join(dir, "fencegate.db"), backup: filepath.Join(dir, "backup.db"),
		clock: fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))}
	f.opts = boltstore.Options{Clock: f.clock, CountFromOne: countFromOne}
	st := open(t, f.path, f.opts)
	a := mustAcquire(t, st, "job", "a")
	f.old = a.Token
	mustAdmit(t, st, "job", f.old)
	closeStore(t, st)
	copyFile(t, f.path, f.backup)

	st = open(t, f.path, f.opts)
	if _, err := st.Release(ctx, fencing.ReleaseRequest{Resource: "job", Owner: "a", Token: f.old}); err != nil {
		t.Fatal(err)
	}
	f.newer = mustAcquire(t, st, "job", "b").Token
	mustAdmit(t, st, "job", f.newer)
	f.other = mustAcquire(t, st, "other", "c").Token
	closeStore(t, st)
	return f
}

func mustAcquire(t *testing.T, st fencing.Store, res, owner string) fencing.Lease {
	t.Helper()
	l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Hour})
	if err != nil {
		t.Fatalf("Acquire(%s, %s): %v", res, owner, err)
	}
	return l
}

func mustAdmit(t *testing.T, st fencing.Store, res string, tok fencing.Token) {
	t.Helper()
	if _, err := st.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: tok}); err != nil {
		t.Fatalf("Admit(%s, %d): %v", res, tok, err)
	}
}

func closeStore(t *testing.T, st *boltstore.Store) {
	t.Helper()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// wantRefused asserts that tok is refused: stale or never issued.
func wantRefused(t *testing.T, st fencing.Store, res string, tok fencing.Token) {
	t.Helper()
	_, err := st.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: tok})
	if !errors.Is(err, fencing.ErrStaleToken) && !errors.Is(err, fencing.ErrTokenNotIssued) {
		t.Fatalf("Admit(%s, %d) after the loss: %v, want it refused", res, tok, err)
	}
}

// wantBeforeLoss asserts that tok is refused as a pre-loss token.
func wantBeforeLoss(t *testing.T, st fencing.Store, res string, tok fencing.Token) {
	t.Helper()
	_, err := st.Admit(context.Background(), fencing.AdmitRequest{Resource: res, Token: tok})
	var stale *fencing.StaleTokenError
	if !errors.As(err, &stale) || !stale.BeforeLoss || stale.HighWater <= tok {
		t.Fatalf("Admit(%s, %d) after the loss: %v, want a stale token from before the loss", res, tok, err)
	}
}

// checkAfterLoss asserts the promise after a loss: the next tokens are above
// every pre-loss token, no pre-loss token is admitted (before or after a
// post-loss write), and a pre-loss live lease is over.
func (f *lossFixture) checkAfterLoss(t *testing.T, st *boltstore.Store) {
	t.Helper()
	if st.LossDetected() == "" {
		t.Fatalf("Open did not detect the loss of %s", f.path)
	}
	for _, tok := range []fencing.Token{f.old, f.newer} {
		wantRefused(t, st, "job", tok)
	}
	l := mustAcquire(t, st, "job", "d")
	if l.Token <= f.newer || l.Token <= f.other {
		t.Fatalf("token after the loss %d, want above every pre-loss token (%d, %d)", l.Token, f.newer, f.other)
	}
	for _, tok := range []fencing.Token{f.old, f.newer} {
		wantBeforeLoss(t, st, "job", tok) // the record exists now
	}
	mustAdmit(t, st, "job", l.Token)
	for _, tok := range []fencing.Token{f.old, f.newer} {
		wantRefused(t, st, "job", tok)
	}
	// "other" was live under c: the lease ended with the loss, so another
	// owner takes it with a new token.
	o := mustAcquire(t, st, "other", "e")
	if o.Token <= f.other {
		t.Fatalf("other: token %d after the loss, want above %d", o.Token, f.other)
	}
}

func TestStoreFileRestoredFromOlderCopy(t *testing.T) {
	f := newLossFixture(t, true)
	copyFile(t, f.backup, f.path)
	st := open(t, f.path, f.opts)
	defer st.Close()
	f.checkAfterLoss(t, st)
}

func TestStoreFileDeleted(t *testing.T) {
	for _, countFromOne := range []bool{false, true} {
		f := newLossFixture(t, countFromOne)
		if err := os.Remove(f.path); err != nil {
			t.Fatal(err)
		}
		st := open(t, f.path, f.opts)
		f.checkAfterLoss(t, st)
		closeStore(t, st)
	}
}

func TestStoreFileReplacedByAnother(t *testing.T) {
	f := newLossFixture(t, true)
	// Another store's file (its own marker elsewhere) moved over this one.
	elsewhere := filepath.Join(t.TempDir(), "fencegate.db")
	other := open(t, elsewhere, f.opts)
	mustAcquire(t, other, "job", "z")
	closeStore(t, other)
	copyFile(t, elsewhere, f.path)
	st := open(t, f.path, f.opts)
	defer st.Close()
	f.checkAfterLoss(t, st)
}

func TestStoreFileMarkerLostOrTorn(t *testing.T) {
	for name, damage := range map[string]func(string) error{
		"missing": os.Remove,
		"torn":    func(p string) error { return os.WriteFile(p, []byte("FGLINE01 torn"), 0o600) },
	} {
		t.Run(name, func(t *testing.T) {
			f := newLossFixture(t, true)
			if err := damage(f.path + ".lineage"); err != nil {
				t.Fatal(err)
			}
			st := open(t, f.path, f.opts)
			defer st.Close()
			if st.LossDetected() == "" {
				t.Fatal("no loss detected")
			}
			// Without the marker the floor comes from the host clock,
			// far above the file's small tokens.
			wantBeforeLoss(t, st, "job", f.newer)
		})
	}
}

// TestStoreFileKeepsCountingAcrossRestart: no loss, no floor; a live lease
// stays live across a clean restart, a second restart is as clean as the
// first, and the next token follows the clock.
func TestStoreFileKeepsCountingAcrossRestart(t *testing.T) {
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "fencegate.db")
	opts := boltstore.Options{Clock: clock}
	st := open(t, path, opts)
	first := mustAcquire(t, st, "job", "a")
	if want := fencing.Token(clock.Now().UnixMicro()) + 1; first.Token != want {
		t.Fatalf("first token of a new file %d, want the clock floor + 1 = %d", first.Token, want)
	}
	mustAdmit(t, st, "job", first.Token)
	closeStore(t, st)
	for range 2 {
		st = open(t, path, opts)
		if st.LossDetected() != "" {
			t.Fatalf("clean restart judged a loss: %s", st.LossDetected())
		}
		if l := mustAcquire(t, st, "job", "a"); l.Token != first.Token {
			t.Fatalf("live lease after restart has token %d, want %d", l.Token, first.Token)
		}
		mustAdmit(t, st, "job", first.Token)
		closeStore(t, st)
	}
	st = open(t, path, opts)
	defer st.Close()
	clock.Advance(2 * time.Hour)
	if l, want := mustAcquire(t, st, "job", "b"), fencing.Token(clock.Now().UnixMicro()); l.Token != want {
		t.Fatalf("next token %d, want the clock %d", l.Token, want)
	}
}

// TestRestoreOneCommitBehindDetected: a copy exactly one commit behind the
// file, restored under the marker, is a loss, not the crash it resembles
// (the marker's committed generation tells them apart).
func TestRestoreOneCommitBehindDetected(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegate.db")
	opts := boltstore.Options{Clock: fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))}
	st := open(t, path, opts)
	a := mustAcquire(t, st, "job", "a")
	var copyOf bytes.Buffer
	if err := st.Backup(&copyOf); err != nil {
		t.Fatal(err)
	}
	mustAdmit(t, st, "job", a.Token) // one commit: the mark raised
	closeStore(t, st)
	if err := os.WriteFile(path, copyOf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	st = open(t, path, opts)
	defer st.Close()
	if st.LossDetected() == "" {
		t.Fatal("a file restored one commit back was not judged a loss")
	}
	wantBeforeLoss(t, st, "job", a.Token)
}

// TestSecondStoreRefusedBesideOneWhoseFileWasDeleted: bbolt's lock is on
// the file's inode, so a file deleted (or replaced) under a running store
// no longer keeps a second store out of the path; the marker, which
// outlives the file, does. Two stores side by side would both grant the
// same resource.
func TestSecondStoreRefusedBesideOneWhoseFileWasDeleted(t *testing.T) {
	for _, how := range []string{"deleted", "replaced"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "fencegate.db")
			first, err := boltstore.Open(path, boltstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer first.Close()
			mustAcquire(t, first, "job", "a")
			if how == "deleted" {
				err = os.Remove(path)
			} else {
				err = os.WriteFile(filepath.Join(dir, "other"), nil, 0o600)
				if err == nil {
					err = os.Rename(filepath.Join(dir, "other"), path)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			second, err := boltstore.Open(path, boltstore.Options{Timeout: 100 * time.Millisecond})
			if err == nil {
				second.Close()
				t.Fatalf("a second store opened on %s beside the first (loss detected %q)", path, second.LossDetected())
			}
			if !errors.Is(err, fencing.ErrUnavailable) || !bytes.Contains([]byte(err.Error()), []byte("locked by another process")) {
				t.Fatalf("second Open: %v, want ErrUnavailable naming the lock", err)
			}
			// Once the first has stopped, the path opens, and the loss is
			// detected against the marker.
			closeStore(t, first)
			third, err := boltstore.Open(path, boltstore.Options{Timeout: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer third.Close()
			if third.LossDetected() == "" {
				t.Errorf("the %s file's loss went undetected", how)
			}
		})
	}
}

// TestRestoredWithMarkerBringsBackTheOldHolder pins a documented limit
// (docs/stores.md, "Limits"): a file restored together with its marker is
// not detected as a loss, and the leases and marks of the copy's moment
// come back, so the holder of that moment writes again after a newer
// holder's write. If detection ever covers it, this test fails and the
// docs must say so.
func TestRestoredWithMarkerBringsBackTheOldHolder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fencegate.db")
	clock := fencingtest.NewFakeClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	opts := boltstore.Options{Clock: clock}
	st, err := boltstore.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	a := mustAcquire(t, st, "job", "a")
	mustAdmit(t, st, "job", a.Token)
	closeStore(t, st)
	copyFile(t, path, filepath.Join(dir, "backup.db"))
	copyFile(t, path+".lineage", filepath.Join(dir, "backup.db.lineage"))

	if st, err = boltstore.Open(path, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Release(context.Background(), fencing.ReleaseRequest{Resource: "job", Owner: "a", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, st, "job", "b")
	mustAdmit(t, st, "job", b.Token)
	closeStore(t, st)

	copyFile(t, filepath.Join(dir, "backup.db"), path)
	copyFile(t, filepath.Join(dir, "backup.db.lineage"), path+".lineage")
	if st, err = boltstore.Open(path, opts); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.LossDetected() != "" {
		t.Fatalf("a restore of file and marker together was detected (%q): update docs/stores.md's limits", st.LossDetected())
	}
	if _, err := st.Admit(context.Background(), fencing.AdmitRequest{Resource: "job", Token: a.Token}); err != nil {
		t.Fatalf("Admit(%d) after the restore: %v; the documented limit no longer holds: update docs/stores.md", a.Token, err)
	}
	// Tokens issued since the copy are refused (not issued), as documented.
	if _, err := st.Admit(context.Background(), fencing.AdmitRequest{Resource: "job", Token: b.Token}); err == nil {
		t.Fatalf("Admit(%d), issued after the copy, admitted after the restore", b.Token)
	}
}
