package pgstore

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
	"github.com/fencegate/fencegate/internal/freeport"
	"github.com/fencegate/fencegate/internal/tiedproc"
)

// startStandby makes a streaming hot standby of c (pg_basebackup -R) and
// starts it on a free port; it returns the port.
func startStandby(t *testing.T, c *pgtest.Cluster) int {
	t.Helper()
	var cred *syscall.Credential
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			os.Chown(d, uid, gid)
		}
	}
	q, _ := url.Parse(c.SocketURL("postgres"))
	sock := q.Query().Get("host")
	cmd := func(name string, args ...string) *exec.Cmd {
		x := exec.Command(filepath.Join(c.BinDir(), name), args...)
		x.Dir = dir
		x.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
		return x
	}
	data := filepath.Join(dir, "data")
	if out, err := cmd("pg_basebackup", "-h", sock, "-p", strconv.Itoa(c.Port()), "-U", pgtest.User, "-D", data, "-R", "-X", "stream").CombinedOutput(); err != nil {
		t.Fatalf("pg_basebackup: %v %s", err, out)
	}
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	logf, _ := os.Create(filepath.Join(dir, "standby.log"))
	p := cmd("postgres", "-D", data, "-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1", "-c", "hot_standby=on", "-c", "max_connections=200")
	p.Stdout, p.Stderr = logf, logf
	if err := tiedproc.Start(p, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Process.Signal(syscall.SIGINT); p.Wait(); logf.Close() })
	for give := time.Now().Add(20 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgconn.Connect(ctx, standbyURL(c, port))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return port
		}
		if time.Now().After(give) {
			log, _ := os.ReadFile(filepath.Join(dir, "standby.log"))
			t.Fatalf("standby: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func standbyURL(c *pgtest.Cluster, port int) string {
	u, _ := url.Parse(c.URL("postgres"))
	u.Host = "127.0.0.1:" + strconv.Itoa(port)
	return u.String()
}

func standbySQL(t *testing.T, c *pgtest.Cluster, port int, sql string) string {
	t.Helper()
	v, err := standbyTry(c, port, sql)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// standbyTry runs sql on the standby and returns the first column of its
// first row.
func standbyTry(c *pgtest.Cluster, port int, sql string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, standbyURL(c, port))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	rs, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", err
	}
	if len(rs) == 0 || len(rs[0].Rows) == 0 {
		return "", nil
	}
	return string(rs[0].Rows[0][0]), nil
}

// TestHotStandbyReadIsNotTrusted: a libpq multi-host URL (primary,
// standby) is the everyday way to name a replicated PostgreSQL; libpq's and
// pgx's default target_session_attrs is "any". While the primary is
// unreachable, new connections must not land on the hot standby, whose
// replay lags (here paused): an admission at the mark is a read, and
// decided on the standby's stale row it would admit a token the primary
// had superseded, after the newer token's write was forwarded. The store
// requires the primary: every operation fails closed instead.
func TestHotStandbyReadIsNotTrusted(t *testing.T) {
	c := pgtest.Start(t)
	port := startStandby(t, c)
	ctx := context.Background()
	u, _ := url.Parse(c.URL("postgres"))
	u.Host = u.Host + ",127.0.0.1:" + strconv.Itoa(port)
	s, err := Open(ctx, Options{URL: u.String(), Schema: "fg", StatementTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const res = "job"
	a, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	// The standby has replayed a's mark...
	for give := time.Now().Add(10 * time.Second); ; {
		// (the standby may not have replayed the schema yet: an error)
		if v, _ := standbyTry(c, port, `SELECT high_water FROM fg.resources WHERE resource = 'job'`); v == strconv.FormatInt(int64(a.Token), 10) {
			break
		}
		if time.Now().After(give) {
			t.Fatal("the standby never replayed a's mark")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// ... and its replay lags from now on.
	standbySQL(t, c, port, `SELECT pg_wal_replay_pause()`)
	if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "a", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if adm, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: b.Token}); err != nil || !adm.Raised {
		t.Fatalf("Admit(b): %+v %v", adm, err)
	}
	// b's write is forwarded. A pooler that sends reads to a standby
	// (pgpool-II's load balancing), which the connection check does not
	// see: here, a pool that reaches the standby without that check.
	cfg, err := poolConfig(Options{URL: standbyURL(c, port)})
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ValidateConnect = nil
	balanced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	primary := s.pool
	s.pool = balanced
	if adm, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: a.Token}); !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), "standby") {
		t.Errorf("a's token %d, superseded by b's %d, read through a pooler that sent the read to a lagging standby: %+v err=%v, want unavailable (a standby)",
			a.Token, b.Token, adm, err)
	}
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "other", Owner: "x", TTL: time.Minute}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Errorf("Acquire sent to a standby: %v, want unavailable", err)
	}
	s.pool = primary
	balanced.Close()
	// The primary becomes unreachable.
	c.Stop()
	if _, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "other", Owner: "x", TTL: time.Minute}); !fencing.IsStoreFault(err) {
		t.Fatalf("Acquire with the primary down: %v, want a store fault", err)
	}
	// a's stale write, and every read, fail closed: the standby is never
	// asked.
	adm, err := s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: a.Token})
	if !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("a's token %d, superseded by b's %d (acknowledged raise, b's write forwarded), with the primary down: %+v err=%v, want unavailable",
			a.Token, b.Token, adm, err)
	}
	if !strings.Contains(err.Error(), "standby") {
		t.Errorf("Admit: %v, want the reason (a standby)", err)
	}
	if st, err := s.Status(ctx, res); !errors.Is(err, fencing.ErrUnavailable) {
		t.Errorf("Status from the standby: %+v %v, want unavailable", st, err)
	}
	if ls, err := s.List(ctx, fencing.ListRequest{}); !errors.Is(err, fencing.ErrUnavailable) {
		t.Errorf("List from the standby: %+v %v, want unavailable", ls, err)
	}
	// A store opened on the standby alone fails closed at Open.
	if s2, err := Open(ctx, Options{URL: standbyURL(c, port), Schema: "fg"}); !errors.Is(err, fencing.ErrUnavailable) || !strings.Contains(err.Error(), "standby") {
		if err == nil {
			s2.Close()
		}
		t.Fatalf("Open on the standby: %v, want unavailable (a standby)", err)
	}
}

// TestTargetSessionAttrs: a URL may ask for the primary (read-write,
// primary), say nothing or say any (each held to a writable primary by the
// session check); one that asks for a standby or a read-only session is
// refused before anything connects.
func TestTargetSessionAttrs(t *testing.T) {
	const base = "postgres://fencegate@127.0.0.1:1/app"
	for _, tsa := range []string{"read-only", "standby", "prefer-standby"} {
		_, err := poolConfig(Options{URL: base + "?target_session_attrs=" + tsa})
		if err == nil || !strings.Contains(err.Error(), "target_session_attrs="+tsa) || errors.Is(err, fencing.ErrUnavailable) {
			t.Errorf("target_session_attrs=%s: %v, want a refusal naming it", tsa, err)
		}
	}
	t.Setenv("PGTARGETSESSIONATTRS", "standby")
	if _, err := poolConfig(Options{URL: base}); err == nil || !strings.Contains(err.Error(), "target_session_attrs=standby") {
		t.Errorf("PGTARGETSESSIONATTRS=standby: %v, want a refusal", err)
	}
	for _, tsa := range []string{"", "any", "read-write", "primary"} {
		u := base
		if tsa != "" {
			u += "?target_session_attrs=" + tsa
		}
		t.Setenv("PGTARGETSESSIONATTRS", "")
		cfg, err := poolConfig(Options{URL: u})
		if err != nil || cfg.ConnConfig.ValidateConnect == nil {
			t.Errorf("target_session_attrs=%q: %v, want the session check", tsa, err)
		}
	}
}
