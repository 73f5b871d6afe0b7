package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// BenchmarkSharedBarrier measures, on one local Valkey-compatible server
// (and BenchmarkSharedBarrierPostgres on one local PostgreSQL) in one run, uncontended fenced writes (64 resources, each held by one
// lease, 4 × GOMAXPROCS concurrent clients) through a gate with the local
// barrier and through a gate with the shared barrier, and reports the
// shared path's throughput and p50 as ratios of the local path's
// (shared/local rps, shared/local p50). Run it alone, without -race:
//
//	go test -run XXX -bench SharedBarrier -benchtime 3s ./proxy/
func BenchmarkSharedBarrier(b *testing.B) {
	srv := valkeytest.Start(b)
	benchSharedBarrier(b, valkeyKit(srv.URL(), []*valkeytest.Server{srv}))
}

// BenchmarkSharedBarrierPostgres is BenchmarkSharedBarrier on PostgreSQL:
//
//	go test -run XXX -bench SharedBarrierPostgres -benchtime 3s ./proxy/
func BenchmarkSharedBarrierPostgres(b *testing.B) {
	benchSharedBarrier(b, postgresKit(b))
}

func benchSharedBarrier(b *testing.B, kit storeKit) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	rules, err := ParseRules("PUT /jobs/{id} fence job:{id}")
	if err != nil {
		b.Fatal(err)
	}
	var localRPS, localP50 float64
	for _, mode := range []string{"local", "shared"} {
		b.Run(mode, func(b *testing.B) {
			st := kit.open(b, fmt.Sprintf("bench%s%d", mode, time.Now().UnixNano()))
			opts := Options{Upstream: u, Store: st, Rules: rules}
			if mode == "shared" {
				opts.SharedBarrier, opts.GateID = st, "bench"
			}
			g, err := New(opts)
			if err != nil {
				b.Fatal(err)
			}
			s := serveGate(b, g)
			toks := make([]fencing.Token, 64)
			for i := range toks {
				l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:" + fencing.Token(i).String(), Owner: "bench", TTL: 3600e9})
				if err != nil {
					b.Fatal(err)
				}
				toks[i] = l.Token
			}
			rps, p50, p99 := load(b, s.URL, toks)
			b.ReportMetric(rps, "req/s")
			b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
			b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
			if mode == "local" {
				localRPS, localP50 = rps, float64(p50)
			} else if localRPS > 0 && p50 > 0 {
				b.ReportMetric(rps/localRPS, "shared/local-rps")
				b.ReportMetric(float64(p50)/localP50, "shared/local-p50")
			}
		})
	}
}
