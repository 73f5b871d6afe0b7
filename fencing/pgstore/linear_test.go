package pgstore

import (
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/fencingtest/linear"
)

// TestLinearizable checks a concurrent history of random calls against the
// model of one resource. Tokens follow the database's clock in µs
// (SkipTokens), as the Valkey store's follow its server's; expiry follows the database's
// clock, which runs on this host, so the model reads the same clock with
// time.Now. The clients pause together every 400 calls (1000 in a soak), for
// up to 2.5 s, so that leases of 1 s and 2 s expire during a run.
func TestLinearizable(t *testing.T) {
	s := open(t, freshSchema())
	linear.Check(t, s, linear.Options{Name: "postgres", SkipTokens: true, Ops: linear.SoakOr(1200, 100000), Resources: 6, Owners: 4,
		GapEvery: linear.SoakOr(400, 1000), Gap: 2500 * time.Millisecond, TTLs: []time.Duration{time.Second, 2 * time.Second}})
}
