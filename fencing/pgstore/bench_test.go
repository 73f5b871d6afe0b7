package pgstore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// BenchmarkStore runs the conformance benchmarks against the package's
// cluster.
func BenchmarkStore(b *testing.B) {
	pgtest.Need(b, cluster)
	fencingtest.RunBenchmarks(b, harness())
}

// callers is the concurrency of the comparison with pgbench: 32 callers
// on both sides, with as many pooled connections.
const callers = 32

// hammer runs op from callers goroutines for d and returns the rate of
// successful calls per second; it stops at the first error.
func hammer(t *testing.T, d time.Duration, op func(ctx context.Context, caller int) error) float64 {
	t.Helper()
	return hammerN(t, callers, d, op)
}

// hammerN is hammer with n callers.
func hammerN(t *testing.T, callers int, d time.Duration, op func(ctx context.Context, caller int) error) float64 {
	t.Helper()
	ctx := context.Background()
	var (
		n    atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, callers)
	)
	deadline := time.Now().Add(d)
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := op(ctx, c); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return float64(n.Load()) / elapsed.Seconds()
}

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// pgbench runs script with callers clients for d against the cluster and
// returns its transactions (script runs) per second.
func pgbench(t *testing.T, c *pgtest.Cluster, script string, d time.Duration, vars ...string) float64 {
	t.Helper()
	return pgbenchN(t, c, callers, script, d, vars...)
}

// pgbenchN is pgbench with n clients.
func pgbenchN(t *testing.T, c *pgtest.Cluster, callers int, script string, d time.Duration, vars ...string) float64 {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.sql")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(c.Port()), "-U", pgtest.User, "-n",
		"-c", strconv.Itoa(callers), "-j", strconv.Itoa(min(callers, 2)), "-T", strconv.Itoa(int(d.Seconds())), "-M", "prepared", "-f", path}
	for _, v := range vars {
		args = append(args, "-D", v)
	}
	cmd := exec.Command(filepath.Join(c.BinDir(), "pgbench"), append(args, "postgres")...)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+pgtest.Password)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pgbench: %v\n%s", err, out)
	}
	m := tpsRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no tps in pgbench output:\n%s", out)
	}
	if strings.Contains(string(out), "number of failed transactions: ") && !strings.Contains(string(out), "number of failed transactions: 0 ") {
		t.Fatalf("pgbench transactions failed:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	return tps
}

// bindVars turns a statement's $n parameters into pgbench variables
// (vars[0] for $1, …), which pgbench -M prepared binds as parameters.
func bindVars(sql string, vars ...string) string {
	for i := len(vars); i >= 1; i-- { // $17 before $1
		sql = strings.ReplaceAll(sql, "$"+strconv.Itoa(i), ":"+vars[i-1])
	}
	return strings.Join(strings.Fields(sql), " ") + ";\n"
}

// TestComparePgbench measures, against one server in one run, the store's
// admissions and lease cycles from 32 concurrent callers (a pool of 32
// connections), next to pgbench running the same SQL with 32 clients:
//
//   - admission at the mark: the store's Admit is one read statement;
//     pgbench runs that statement.
//   - cycle: Acquire, Renew, Release, each a transaction of BEGIN, the
//     locking read, the row update, COMMIT; pgbench runs three such
//     transactions per script (the update's parameters are constants of
//     the same types: pgbench cannot carry a row into the next
//     statement), each client on its own row.
//
// It prints the rates and the ratios. It runs only with
// FENCEGATE_PG_BENCH=1:
//
//	FENCEGATE_PG_BENCH=1 go test -run ComparePgbench -v ./fencing/pgstore/
func TestComparePgbench(t *testing.T) {
	if os.Getenv("FENCEGATE_PG_BENCH") != "1" {
		t.Skip("set FENCEGATE_PG_BENCH=1 to compare with pgbench")
	}
	c := pgtest.Need(t, cluster)
	if _, err := os.Stat(filepath.Join(c.BinDir(), "pgbench")); err != nil {
		t.Skip("no pgbench beside the server binaries")
	}
	schema := freshSchema()
	// All connections opened up front (scram authentication is costly),
	// as pgbench opens its clients before it starts the clock.
	n := strconv.Itoa(callers)
	s, err := Open(context.Background(), Options{URL: c.URL("postgres") + "&pool_max_conns=" + n + "&pool_min_conns=" + n,
		Schema: schema, StatementTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const d = 5 * time.Second

	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "hot", Owner: "w", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "hot", Token: l.Token}); err != nil {
		t.Fatal(err)
	}
	for wait := time.Now().Add(30 * time.Second); s.pool.Stat().TotalConns() < callers && time.Now().Before(wait); {
		time.Sleep(20 * time.Millisecond)
	}
	goAdmit := hammer(t, d, func(ctx context.Context, _ int) error {
		a, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "hot", Token: l.Token})
		if err == nil && a.Raised {
			err = fmt.Errorf("an admission at the mark raised it")
		}
		return err
	})
	benchAdmit := pgbench(t, c, bindVars(s.sql.read, "res"), d, "res=hot")

	goCycle := hammer(t, d, func(ctx context.Context, caller int) error {
		res := "cyc:" + strconv.Itoa(caller)
		l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "w", TTL: time.Minute})
		if err == nil {
			_, err = s.Renew(ctx, fencing.RenewRequest{Resource: res, Owner: "w", Token: l.Token})
		}
		if err == nil {
			_, err = s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "w", Token: l.Token})
		}
		return err
	})
	// pgbench's rows: resource = the client id, like the store's one row
	// per caller.
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+schema+`.resources (resource, issued) SELECT g::text, 1 FROM generate_series(0, $1) g`, callers); err != nil {
		t.Fatal(err)
	}
	tx := "BEGIN;\n" + bindVars(s.sql.readLocked, "client_id") +
		bindVars(s.sql.update, "client_id", "tok", "tok", "owner", "tok", "ttl", "ts", "ts", "f", "f",
			"owner", "tok", "ended", "f", "tok", "ts", "size") + "COMMIT;\n"
	benchCycle := pgbench(t, c, "\\set tok random(1, 1000000000)\n"+tx+tx+tx, d,
		"owner=w", "ttl=60000", "ts=2026-01-01T00:00:00Z", "f=false", "ended=released", "size=0")

	t.Logf("admission at the mark, %d callers: store %.0f admits/s, pgbench (same SQL, -c %d -M prepared) %.0f/s, ratio %.2f",
		callers, goAdmit, callers, benchAdmit, goAdmit/benchAdmit)
	t.Logf("acquire+renew+release, %d callers: store %.0f cycles/s, pgbench (same SQL, 3 transactions per script) %.0f/s, ratio %.2f",
		callers, goCycle, benchCycle, goCycle/benchCycle)
}

// TestCompareAcquirePgbench measures, against one server in one run,
// acquisitions of resources never used before (each a new row: BEGIN, the
// locking read, the INSERT, COMMIT) at 1 and 16 concurrent callers, on the
// store as it opens by default (no pool_max_conns in the URL), next to
// pgbench running the same four statements with 1 and 16 clients, each
// transaction on a random new resource. A store that serializes where
// PostgreSQL would not shows up as a ratio at 16 well below the one at 1.
// It prints the rates and ratios, and runs only with FENCEGATE_PG_BENCH=1:
//
//	FENCEGATE_PG_BENCH=1 go test -run CompareAcquirePgbench -v ./fencing/pgstore/
func TestCompareAcquirePgbench(t *testing.T) {
	if os.Getenv("FENCEGATE_PG_BENCH") != "1" {
		t.Skip("set FENCEGATE_PG_BENCH=1 to compare with pgbench")
	}
	c := pgtest.Need(t, cluster)
	if _, err := os.Stat(filepath.Join(c.BinDir(), "pgbench")); err != nil {
		t.Skip("no pgbench beside the server binaries")
	}
	schema := freshSchema()
	s, err := Open(context.Background(), Options{URL: c.URL("postgres"), Schema: schema, StatementTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const d = 5 * time.Second
	t.Logf("store pool: at most %d connections (default)", s.pool.Config().MaxConns)

	// The INSERT of a new resource's record as the store writes it after
	// an acquisition: issued = the token, the lease, nothing prior, no
	// checkpoint.
	ins := strings.Join(strings.Fields(s.sql.insert), " ")
	for i, v := range []string{":res", ":tok", "0", ":owner", ":tok", ":ttl", ":ts", ":ts", "false", "false",
		"NULL", "NULL", "NULL", "false", "NULL", "NULL", "NULL"} {
		ins = strings.Replace(ins, "$"+strconv.Itoa(i+1)+",", v+",", 1)
		ins = strings.Replace(ins, "$"+strconv.Itoa(i+1)+")", v+")", 1)
	}
	script := "\\set res random(1, 1000000000000)\nBEGIN;\n" +
		bindVars(s.sql.readLocked, "res") + ins + ";\nCOMMIT;\n"

	var seq atomic.Int64
	rates := map[int][2]float64{}
	for _, n := range []int{1, 16} {
		// Warm the pool up to n connections, as pgbench opens its
		// clients before it starts the clock.
		hammerN(t, n, 500*time.Millisecond, func(ctx context.Context, caller int) error {
			_, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: fmt.Sprintf("warm:%d", seq.Add(1)), Owner: "w", TTL: time.Minute})
			return err
		})
		store := hammerN(t, n, d, func(ctx context.Context, caller int) error {
			_, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: fmt.Sprintf("fresh:%d", seq.Add(1)), Owner: "w", TTL: time.Minute})
			return err
		})
		bench := pgbenchN(t, c, n, script, d, "owner=w", "tok=1", "ttl=60000", "ts=2026-01-01T00:00:00Z")
		rates[n] = [2]float64{store, bench}
		t.Logf("fresh acquisitions, %2d callers: store %.0f/s, pgbench (same SQL, -c %d -M prepared) %.0f/s, ratio %.2f",
			n, store, n, bench, store/bench)
	}
	t.Logf("16 over 1 caller: store %.2f, pgbench %.2f", rates[16][0]/rates[1][0], rates[16][1]/rates[1][1])
}
