// Package valkeytest starts throwaway Valkey-compatible servers for tests:
// one node (Start) or a cluster of primaries (StartCluster), on free loopback
// ports, with their data directories in t.TempDir(), stopped by PID in
// t.Cleanup.
//
// It runs valkey-server (and valkey-cli) when they are on PATH, else
// redis-server (and redis-cli). When no server binary is found the test is
// skipped, unless FENCEGATE_REQUIRE_VALKEY=1 or CI=true, where it fails: a
// CI run must not pass by skipping the store's tests. With FENCEGATE_QUICK=1
// (the quick inner loop of scripts/test.sh) every test that needs a server
// is skipped.
package valkeytest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/freeport"
	"github.com/fencegate/fencegate/internal/tiedproc"
)

// Option changes how a server is started.
type Option func(*config)

type config struct {
	persist  bool
	password string
	args     []string
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithPassword requires the password (requirepass); Do authenticates with
// it and URL includes it.
func WithPassword(pw string) Option { return func(c *config) { c.password = pw } }

// WithPersistence turns on AOF (appendonly yes, appendfsync always) so that
// Restart keeps the data.
func WithPersistence() Option { return func(c *config) { c.persist = true } }

// WithArgs appends server arguments, for example
// WithArgs("--maxmemory-policy", "allkeys-lru"); later arguments win.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// Server is one running server process. Its methods may be called from the
// test's goroutine only (Kill and Restart are not safe for concurrent use
// with each other).
type Server struct {
	t    testing.TB
	bin  string
	port int
	dir  string
	args []string
	pass string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives the process's exit once
}

// binaries finds the server and CLI binaries, or skips/fails the test.
func binaries(t testing.TB) (server, cli string) {
	t.Helper()
	if os.Getenv("FENCEGATE_QUICK") == "1" {
		t.Skip("valkeytest: FENCEGATE_QUICK=1 (scripts/test.sh --quick) skips tests that need a server")
		return "", ""
	}
	for _, pair := range [][2]string{{"valkey-server", "valkey-cli"}, {"redis-server", "redis-cli"}} {
		if s, err := exec.LookPath(pair[0]); err == nil {
			c, _ := exec.LookPath(pair[1])
			return s, c
		}
	}
	msg := "valkeytest: no valkey-server or redis-server on PATH (install valkey or Debian's redis-server)"
	if os.Getenv("FENCEGATE_REQUIRE_VALKEY") == "1" || os.Getenv("CI") == "true" {
		t.Fatal(msg + "; FENCEGATE_REQUIRE_VALKEY=1 or CI=true requires it")
		return "", ""
	}
	t.Skip(msg)
	return "", ""
}

// freePort is a free loopback port (freeport). Another process may take
// it before the server binds; start retries with a new port. For a
// cluster node (bus), the port 10000 above it, where the node listens for
// its cluster bus, is free and below the ephemeral range too: outgoing
// connections on a busy machine would otherwise take it.
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	offset := 0
	if bus {
		offset = 10000
	}
	p, err := freeport.PortPair(offset)
	if err != nil {
		t.Fatalf("valkeytest: %v", err)
	}
	return p
}

// Start starts a server on a free loopback port (no persistence unless
// WithPersistence, maxmemory-policy noeviction) and stops it when the test
// ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin, _ := binaries(t)
	return start(t, bin, newConfig(opts), nil)
}

func start(t testing.TB, bin string, c config, extra []string) *Server {
	t.Helper()
	dir := t.TempDir()
	args := []string{"--bind", "127.0.0.1", "--dir", dir, "--maxmemory-policy", "noeviction", "--save", "", "--logfile", "server.log"}
	if c.persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if c.password != "" {
		args = append(args, "--requirepass", c.password)
	}
	args = append(args, extra...)
	args = append(args, c.args...)
	s := &Server{t: t, bin: bin, dir: dir, args: args, pass: c.password}
	var err error
	bus := slices.Contains(args, "--cluster-enabled")
	for range 3 {
		s.port = freePort(t, bus)
		if err = s.launch(); err == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("valkeytest: start %s: %v", bin, err)
	return nil
}

// launch starts the process and waits until it answers PING.
func (s *Server) launch() error {
	args := append([]string{"--port", strconv.Itoa(s.port)}, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := tiedproc.Start(cmd, syscall.SIGKILL); err != nil { // its data is the test's only
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			return fmt.Errorf("server exited (%v): %s", err, lastLines(string(log), 5))
		default:
		}
		if r, err := s.Do("PING"); err == nil && r == "PONG" {
			s.mu.Lock()
			s.cmd, s.exited = cmd, exited
			s.mu.Unlock()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	<-exited
	return errors.New("server did not answer PING within 10s")
}

// waitUntil polls done every 50 ms until it returns nil, and fails the test
// with done's last error once deadline has passed.
func waitUntil(t testing.TB, deadline time.Time, done func() error) {
	t.Helper()
	for {
		err := done()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("valkeytest: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is valkey://127.0.0.1:PORT, with :password@ when WithPassword.
func (s *Server) URL() string {
	if s.pass != "" {
		return "valkey://:" + s.pass + "@" + s.Addr()
	}
	return "valkey://" + s.Addr()
}

// Kill ends the server with SIGKILL (no shutdown save) and waits until its
// port is closed.
func (s *Server) Kill() {
	s.t.Helper()
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd, s.exited = nil, nil
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil || cmd.Process.Pid <= 0 {
		return
	}
	cmd.Process.Kill() // SIGKILL to this PID only
	<-exited
	for range 500 {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// Freeze stops the server process with SIGSTOP (its connections stay open
// but it answers nothing, as a hung or paused node would) until Thaw or the
// end of the test, which sends SIGCONT.
func (s *Server) Freeze() {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil || cmd.Process.Pid <= 0 {
		s.t.Fatal("valkeytest: Freeze on a server that is not running")
		return
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("valkeytest: SIGSTOP %d: %v", cmd.Process.Pid, err)
	}
	s.t.Cleanup(s.Thaw)
}

// Thaw resumes a server stopped by Freeze with SIGCONT. Calling it on a
// server that is not frozen does nothing.
func (s *Server) Thaw() {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil && cmd.Process != nil && cmd.Process.Pid > 0 {
		cmd.Process.Signal(syscall.SIGCONT) // to this PID only
	}
}

// StartReplica starts a server (with the same options as Start) that
// replicates primary (--replicaof), and waits until its replication link is
// up and primary counts it as a connected replica; it fails the test after
// 30 s. Kill, Freeze or Restart it like any server.
func StartReplica(t testing.TB, primary *Server, opts ...Option) *Server {
	t.Helper()
	c := newConfig(opts)
	if c.password == "" && primary.pass != "" {
		c.password = primary.pass
	}
	bin, _ := binaries(t)
	// A full sync would otherwise wait for more replicas to join.
	primary.MustDo("CONFIG", "SET", "repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(primary.Addr())
	extra := []string{"--replicaof", host, port}
	if primary.pass != "" {
		extra = append(extra, "--masterauth", primary.pass)
	}
	r := start(t, bin, c, extra)
	// Online is not enough: a freshly synced replica may not acknowledge
	// offsets for up to a second, so also wait until a write on one
	// connection is confirmed by WAIT 1.
	waitUntil(t, time.Now().Add(30*time.Second), func() error {
		info, err := r.Do("INFO", "replication")
		pinfo, perr := primary.Do("INFO", "replication")
		if err == nil && perr == nil && strings.Contains(info, "master_link_status:up") &&
			strings.Contains(pinfo, "port="+strconv.Itoa(r.port)+",state=online") {
			acked, err := primary.doAll([]string{"SET", "valkeytest:replica-probe", r.Addr()}, []string{"WAIT", "1", "100"})
			if err == nil && acked[1] != "0" {
				return nil
			}
		}
		return fmt.Errorf("replica %s of %s not online and acknowledging within 30s: %v %v", r.Addr(), primary.Addr(), err, perr)
	})
	return r
}

// Restart kills the server and starts it again on the same port and data
// directory: empty, unless started WithPersistence (then the AOF is
// replayed).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for range 50 { // the port may linger briefly
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("valkeytest: restart on port %d: %v", s.port, err)
}

// Do sends one command over a fresh connection (authenticated first when
// WithPassword) and returns the reply
// rendered as text: simple strings and bulk strings as is, integers in
// decimal, arrays as their elements joined by newlines. An error reply is
// returned as an error.
func (s *Server) Do(args ...string) (string, error) {
	r, err := s.doAll(args)
	if err != nil {
		return "", err
	}
	return r[0], nil
}

// doAll sends commands in order over one fresh connection and returns their
// replies (as Do renders them); it stops at the first error.
func (s *Server) doAll(cmds ...[]string) ([]string, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	if s.pass != "" {
		if _, err := roundTrip(c, r, "AUTH", s.pass); err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, len(cmds))
	for _, cmd := range cmds {
		reply, err := roundTrip(c, r, cmd...)
		if err != nil {
			return out, err
		}
		out = append(out, reply)
	}
	return out, nil
}

func roundTrip(c net.Conn, r *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(r)
}

// MustDoAll sends commands in order over one connection (a MULTI and its
// EXEC, say) and returns their replies as Do renders them; it fails the
// test on an error reply.
func (s *Server) MustDoAll(cmds ...[]string) []string {
	s.t.Helper()
	r, err := s.doAll(cmds...)
	if err != nil {
		s.t.Fatalf("valkeytest: %q: %v", cmds, err)
	}
	return r
}

// MustDo is Do that fails the test on error.
func (s *Server) MustDo(args ...string) string {
	s.t.Helper()
	r, err := s.Do(args...)
	if err != nil {
		s.t.Fatalf("valkeytest: %s: %v", strings.Join(args, " "), err)
	}
	return r
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, max(n, 0))
		for range n {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// Cluster is a Valkey Cluster on loopback: primaries (StartCluster), and
// the replicas AddReplica attached.
type Cluster struct {
	// Nodes are the primaries, in the order StartCluster created them.
	Nodes []*Server

	bin   string
	extra []string
	conf  config
}

// URL is valkey://first?addr=second&addr=third..., every node a seed.
func (c *Cluster) URL() string {
	u := c.Nodes[0].URL()
	for i, n := range c.Nodes[1:] {
		if i == 0 {
			u += "?"
		} else {
			u += "&"
		}
		u += "addr=" + n.Addr()
	}
	return u
}

// StartCluster starts n (>= 3) cluster-enabled servers, joins them with
// `<cli> --cluster create ... --cluster-yes` (n primaries, no replicas), and
// waits until every node reports cluster_state:ok.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("valkeytest: a cluster needs at least 3 primaries, got %d", n)
	}
	c := newConfig(opts)
	bin, cli := binaries(t)
	if cli == "" {
		t.Fatalf("valkeytest: %s found but no valkey-cli/redis-cli to create the cluster", bin)
	}
	cl := &Cluster{bin: bin, conf: c, extra: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"}}
	addrs := []string{}
	for range n {
		s := start(t, bin, c, cl.extra)
		cl.Nodes = append(cl.Nodes, s)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("valkeytest: %s --cluster create: %v\n%s", cli, err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range cl.Nodes {
		waitUntil(t, deadline, func() error {
			info, err := s.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				return nil
			}
			return fmt.Errorf("cluster not ok after 30s on %s: %v %s", s.Addr(), err, info)
		})
	}
	return cl
}

// AddReplica starts one more cluster-enabled server, joins it to the
// cluster (CLUSTER MEET) as a replica of Nodes[primary] (CLUSTER REPLICATE),
// and waits until its replication link is up and every primary lists it in
// CLUSTER SLOTS, so that a client opened afterwards knows it. It fails the
// test after 30 s.
func (c *Cluster) AddReplica(t testing.TB, primary int) *Server {
	t.Helper()
	p := c.Nodes[primary]
	// A full sync would otherwise wait 5 s for more replicas to join; and
	// nodes list a replica in CLUSTER SLOTS only once its replication
	// offset is not 0, which on an idle primary takes a replication PING
	// (every 10 s by default).
	p.MustDo("CONFIG", "SET", "repl-diskless-sync-delay", "0")
	p.MustDo("CONFIG", "SET", "repl-ping-replica-period", "1")
	r := start(t, c.bin, c.conf, c.extra)
	// Meet every primary, so that each learns the new node at once rather
	// than by gossip.
	for _, n := range c.Nodes {
		host, port, _ := net.SplitHostPort(n.Addr())
		r.MustDo("CLUSTER", "MEET", host, port)
	}
	id := strings.TrimSpace(p.MustDo("CLUSTER", "MYID"))
	deadline := time.Now().Add(30 * time.Second)
	wait := func(what string, done func() bool) {
		t.Helper()
		waitUntil(t, deadline, func() error {
			if done() {
				return nil
			}
			return fmt.Errorf("replica %s of %s: %s not reached within 30s", r.Addr(), p.Addr(), what)
		})
	}
	// REPLICATE fails until the new node has learned the primary's ID.
	wait("CLUSTER REPLICATE accepted", func() bool { _, err := r.Do("CLUSTER", "REPLICATE", id); return err == nil })
	wait("master_link_status:up", func() bool {
		info, err := r.Do("INFO", "replication")
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	_, rport, _ := net.SplitHostPort(r.Addr())
	for _, n := range c.Nodes {
		wait("listed by "+n.Addr(), func() bool {
			// CLUSTER SLOTS renders ports as integers: one line each.
			slots, err := n.Do("CLUSTER", "SLOTS")
			return err == nil && slices.Contains(strings.Split(slots, "\n"), rport)
		})
	}
	return r
}
