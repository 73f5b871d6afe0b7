package proxy

import (
	"context"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fencing/pgstore"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// pgCluster is the package's one PostgreSQL server (nil: not installed;
// the PostgreSQL tests then skip, see pgtest).
var pgCluster *pgtest.Cluster

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, &pgCluster)) }

// postgresKit reaches pgstore on the package's cluster, one schema per
// namespace; it skips the test when PostgreSQL is missing.
func postgresKit(t testing.TB) storeKit {
	c := pgtest.Need(t, pgCluster)
	url := c.SocketURL("postgres") + "&pool_max_conns=16"
	admin, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	millis := func(t testing.TB, sql string, args ...any) int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var ms int64
		if err := admin.QueryRow(ctx, sql, args...).Scan(&ms); err != nil {
			t.Error(err)
		}
		return ms
	}
	open := func(t testing.TB, url, ns string, timeout time.Duration) sharedStore {
		st, err := pgstore.Open(context.Background(), pgstore.Options{URL: url, Schema: ns, StatementTimeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	return storeKit{
		open: func(t testing.TB, ns string) sharedStore { return open(t, url, ns, 10*time.Second) },
		addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port())),
		via: func(t testing.TB, ns, addr string, timeout time.Duration) sharedStore {
			u, err := neturl.Parse(c.URL("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			u.Host = addr
			return open(t, u.String()+"&connect_timeout="+strconv.Itoa(max(1, int(timeout/time.Second))), ns, timeout)
		},
		gateEntries: func(t testing.TB, ns, resource, gate string) int {
			var n int
			if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM `+ns+`.barrier WHERE resource = $1 AND gate = $2`, resource, gate).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		now: func(t testing.TB) int64 {
			return millis(t, `SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint`)
		},
		deadline: func(t testing.TB, ns, resource string) int64 {
			t.Helper()
			var n int
			if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM `+ns+`.barrier WHERE resource = $1`, resource).Scan(&n); err != nil || n != 1 {
				t.Fatalf("%d barrier entries (%v), want 1", n, err)
			}
			return millis(t, `SELECT floor(extract(epoch FROM deadline) * 1000)::bigint FROM `+ns+`.barrier WHERE resource = $1`, resource)
		},
	}
}
