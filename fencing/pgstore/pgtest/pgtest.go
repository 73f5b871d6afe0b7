// Package pgtest starts throwaway PostgreSQL clusters for tests: initdb in a
// temporary directory, then the postgres server itself (no pg_ctl, so the
// postmaster's PID is known and a test can kill it) on a free loopback port,
// its Unix socket in the same directory, fsync on, password authentication
// over TCP.
//
// initdb and postgres refuse to run as root: when the test runs as root the
// cluster runs as the system user "postgres" (the directory is handed to
// it); otherwise it runs as the test's own user.
//
// Binaries are looked up on PATH (initdb), then in /usr/lib/postgresql/*/bin
// (Debian keeps them off PATH), highest version first. When none is found
// the test is skipped, unless FENCEGATE_REQUIRE_POSTGRES=1 or CI=true, where
// it fails: a CI run must not pass by skipping the store's tests.
//
// A package shares one cluster: its TestMain calls Main, and each test
// isolates itself by schema or database name. On Linux a server ends with
// the test binary even when the binary is killed (a -timeout, a signal),
// so a killed run leaves no server behind.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/internal/freeport"
	"github.com/fencegate/fencegate/internal/tiedproc"
)

// User and Password are the superuser every cluster is created with.
// Password authentication (scram-sha-256) is required over TCP.
const (
	User     = "postgres"
	Password = "fencegate-test"
)

// Cluster is one PostgreSQL cluster and its running server. Stop, Kill and
// Start may be called from one goroutine at a time.
type Cluster struct {
	bin  string // directory of initdb and postgres
	dir  string // holds data/, the socket and server.log
	port int
	cred *syscall.Credential // nil: run as the current user

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// errMissing reports that no PostgreSQL binaries were found.
var errMissing = errors.New("pgtest: no PostgreSQL server binaries (initdb on PATH or in /usr/lib/postgresql/*/bin; install Debian's postgresql)")

// required reports whether a missing PostgreSQL must fail the run.
// quick reports FENCEGATE_QUICK=1 (scripts/test.sh --quick): tests that
// need a server skip.
func quick() bool { return os.Getenv("FENCEGATE_QUICK") == "1" }

var errQuick = errors.New("pgtest: FENCEGATE_QUICK=1 (scripts/test.sh --quick) skips tests that need a server")

func required() bool {
	return os.Getenv("FENCEGATE_REQUIRE_POSTGRES") == "1" || os.Getenv("CI") == "true"
}

// BinDir finds the directory holding initdb, postgres and pgbench.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		// A link on PATH (/usr/local/bin/initdb) leads to the directory
		// that also holds postgres and pgbench.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return versionOf(b) - versionOf(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errMissing
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// New creates a cluster (initdb) in a new temporary directory and starts
// it. The caller must Remove it. Use Start(t) in a test, Main in TestMain.
func New() (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest")
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, dir: dir}
	if err := c.create(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var startErr error
	for range 3 { // the free port may be taken before the server binds it
		if c.port, startErr = freeport.Port(); startErr != nil {
			break
		}
		if startErr = c.Start(); startErr == nil {
			return c, nil
		}
	}
	os.RemoveAll(dir)
	return nil, startErr
}

// create runs initdb, as user postgres when running as root.
func (c *Cluster) create() error {
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("pgtest: running as root needs the system user postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(c.dir, uid, gid); err != nil {
			return err
		}
	}
	pwfile := filepath.Join(c.dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(Password+"\n"), 0o644); err != nil {
		return err
	}
	out, err := c.command("initdb", "-D", c.dataDir(), "-U", User, "--pwfile", pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-instructions").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: initdb: %v: %s", err, lastLines(string(out), 5))
	}
	return nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	return cmd
}

// Start starts the server on the cluster's port and waits until it accepts
// connections. It fails if the server is already running.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("pgtest: server already running")
	}
	logf, err := os.OpenFile(filepath.Join(c.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := c.command("postgres", "-D", c.dataDir(), "-p", strconv.Itoa(c.port), "-k", c.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=on", "-c", "synchronous_commit=on",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB", "-c", "logging_collector=off")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := tiedproc.Start(cmd, syscall.SIGINT); err != nil { // SIGINT: fast shutdown
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgconn.Connect(ctx, c.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			c.cmd, c.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
			return fmt.Errorf("pgtest: postgres exited: %s", lastLines(string(log), 5))
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("pgtest: postgres did not accept connections within 20s: %v", err)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// Stop shuts the server down fast (SIGINT: active transactions are rolled
// back, connections closed, a checkpoint written) and waits for it. A
// stopped server is harmless to stop again.
func (c *Cluster) Stop() { c.signal(syscall.SIGINT) }

// Kill kills the postmaster with SIGKILL (a crash: no shutdown
// checkpoint), waits for it to exit, then waits until its backends have
// noticed and gone, so that Start can recover the cluster.
func (c *Cluster) Kill() {
	c.signal(syscall.SIGKILL)
	// Orphaned backends exit when they see the postmaster gone; Start
	// refuses while they still hold the shared memory.
	for i := 0; i < 200 && backendsAlive(c.dir); i++ {
		time.Sleep(25 * time.Millisecond)
	}
}

func (c *Cluster) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return
	}
	c.cmd.Process.Signal(sig)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
	}
	c.cmd, c.exited = nil, nil
}

// backendsAlive reports whether any process still runs in dir's data
// directory (PostgreSQL's backends do).
func backendsAlive(dir string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cwd")
	data := filepath.Join(dir, "data")
	for _, p := range procs {
		if cwd, err := os.Readlink(p); err == nil && cwd == data {
			return true
		}
	}
	return false
}

// PID is the running postmaster's process id, 0 when stopped.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Port is the server's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// BinDir is the directory of the cluster's PostgreSQL binaries.
func (c *Cluster) BinDir() string { return c.bin }

// URL is a postgres:// URL for database db over TCP on 127.0.0.1, as the
// superuser, with the password and sslmode=disable.
func (c *Cluster) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(User, Password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// SocketURL is a postgres:// URL for database db over the cluster's Unix
// socket, where no password is asked (trust): cheaper to connect to than
// TCP with scram-sha-256, for tests that open many pools.
func (c *Cluster) SocketURL(db string) string {
	q := url.Values{"host": {c.dir}, "port": {strconv.Itoa(c.port)}, "user": {User}, "sslmode": {"disable"}}
	return "postgres:///" + db + "?" + q.Encode()
}

// URLNoPassword is URL without the password.
func (c *Cluster) URLNoPassword(db string) string {
	u, _ := url.Parse(c.URL(db))
	u.User = url.User(User)
	return u.String()
}

// Exec runs sql (one or more statements, simple protocol) in database db
// over the Unix socket.
func (c *Cluster) Exec(db, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, c.URL(db))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql).ReadAll()
	return err
}

// Remove stops the server and deletes the cluster's directory.
func (c *Cluster) Remove() {
	c.Stop()
	os.RemoveAll(c.dir)
}

// Start creates and starts a cluster for one test, removed when it ends;
// it skips or fails the test when PostgreSQL is missing (see the package
// doc). Prefer one cluster per package (Main) where tests can share it.
func Start(t testing.TB) *Cluster {
	t.Helper()
	if quick() {
		t.Skip(errQuick)
	}
	c, err := New()
	if errors.Is(err, errMissing) && !required() {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Remove)
	return c
}

// Main runs the package's tests with one shared cluster, stored in *shared
// (nil when PostgreSQL is missing and not required: tests then call Need,
// which skips). It returns the exit code for os.Exit.
func Main(m *testing.M, shared **Cluster) int {
	if quick() {
		fmt.Fprintln(os.Stderr, errQuick)
		return m.Run() // tests call Need, which skips
	}
	c, err := New()
	switch {
	case errors.Is(err, errMissing) && !required():
		fmt.Fprintln(os.Stderr, err, "- PostgreSQL tests skip")
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return 1
	default:
		*shared = c
		defer c.Remove()
	}
	return m.Run()
}

// Need returns c, or skips the test when the package has no cluster.
func Need(t testing.TB, c *Cluster) *Cluster {
	t.Helper()
	if c == nil {
		t.Skip(errMissing)
	}
	return c
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}
