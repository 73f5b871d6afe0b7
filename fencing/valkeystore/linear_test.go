package valkeystore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/fencingtest/linear"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// The Valkey store's tokens follow the server's clock in µs (SkipTokens),
// and its expiry is judged by the server's TIME: the servers run on this
// host, so the model reads the same clock with time.Now. The clients pause
// together every 400 calls (1000 in a soak), for up to 2.5 s, so that
// leases of 1 s and 2 s expire during a run (or survive a short pause).

// realClock are the options every Valkey run shares.
func realClock(name string, ops int) linear.Options {
	return linear.Options{Name: name, SkipTokens: true, Ops: ops, Resources: 6, Owners: 4,
		GapEvery: linear.SoakOr(400, 1000), Gap: 2500 * time.Millisecond, TTLs: []time.Duration{time.Second, 2 * time.Second}}
}

func TestLinearizable(t *testing.T) {
	srv := valkeytest.Start(t)
	s := open(t, srv.URL(), freshPrefix())
	linear.Check(t, s, realClock("valkey", linear.SoakOr(1200, 100000)))
}

func TestLinearizableCluster(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	s := open(t, cl.URL(), freshPrefix())
	opts := realClock("valkey-cluster", linear.SoakOr(1200, 100000))
	opts.Resources, opts.Clients = 9, 8 // spread over the primaries
	linear.Check(t, s, opts)
}

// TestLinearizableUnderFaults runs the workload while a nemesis pauses the
// server (SIGSTOP, then SIGCONT), kills it with SIGKILL and restarts it over
// its AOF (appendfsync always: every acknowledged write survives), and
// holds every command longer than the client waits (CLIENT PAUSE longer
// than the command timeout, so calls time out after sending and run later).
// Calls that time out are ambiguous and recorded as pending; the history
// must still be linearizable.
func TestLinearizableUnderFaults(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.WithPersistence())
	const cmdTimeout = 250 * time.Millisecond
	s, err := Open(context.Background(), Options{URL: srv.URL(), KeyPrefix: freshPrefix(), CommandTimeout: cmdTimeout, DialTimeout: cmdTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	opts := realClock("valkey-faults", linear.SoakOr(1200, 100000))
	opts.Nemesis = nemesis(t, srv, cmdTimeout)
	linear.Check(t, s, opts)
}

// nemesis cycles through the faults, at least once each and then until
// stop is closed, healing each before the next, and counts them.
func nemesis(t *testing.T, srv *valkeytest.Server, cmdTimeout time.Duration) func(stop <-chan struct{}) map[string]int {
	return func(stop <-chan struct{}) map[string]int {
		counts := map[string]int{}
		order := []string{"SIGSTOP/SIGCONT", "kill -9 + restart (AOF)", "CLIENT PAUSE > client timeout"}
		calm := func(d time.Duration) bool {
			select {
			case <-stop:
				return false
			case <-time.After(d):
				return true
			}
		}
		// The first round runs whole, whatever the clients are doing.
		for i := 0; i < len(order) || calm(300*time.Millisecond); i++ {
			if i < len(order) {
				time.Sleep(150 * time.Millisecond)
			}
			fault := order[i%len(order)]
			switch i % len(order) {
			case 0:
				srv.Freeze()
				time.Sleep(2 * cmdTimeout)
				srv.Thaw()
			case 1:
				srv.Restart()
			case 2:
				ms := (2 * cmdTimeout).Milliseconds()
				srv.MustDo("CLIENT", "PAUSE", fmt.Sprint(ms), "ALL")
				time.Sleep(time.Duration(ms) * time.Millisecond)
			}
			counts[fault]++
		}
		return counts
	}
}
