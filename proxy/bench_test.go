package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/storemetrics"
	"github.com/fencegate/fencegate/fencing/valkeystore"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// BenchmarkGate measures, in one run, fenced writes (PUT /jobs/{id} with a
// Fencing-Token, 64 resources, each held by one lease) sent with 4 ×
// GOMAXPROCS concurrent clients:
//
//   - direct: straight to the upstream;
//   - reverseproxy: through a bare httputil.ReverseProxy with the gate's
//     tuned transport;
//   - gate-memory, gate-file, gate-valkey: through the gate, admitting
//     every write in the memory store, the file (bbolt) store or a local
//     Valkey-compatible server.
//
// It reports req/s, p50 and p99 latency, and each path's throughput as a
// fraction of direct's (rps/direct). Run it alone, without -race:
//
//	go test -run XXX -bench Gate -benchtime 2s ./proxy/
func BenchmarkGate(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	const resources = 64
	hold := func(b *testing.B, st fencing.Store) []fencing.Token {
		toks := make([]fencing.Token, resources)
		for i := range toks {
			l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: fmt.Sprintf("job:%d", i), Owner: "bench", TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			toks[i] = l.Token
		}
		return toks
	}
	rules, err := ParseRules("PUT /jobs/{id} fence job:{id}")
	if err != nil {
		b.Fatal(err)
	}
	gate := func(b *testing.B, st fencing.Store) *Gate {
		g, err := New(Options{Upstream: u, Store: st, Rules: rules})
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	var direct float64 // req/s of the direct path, for the ratios
	run := func(name string, setup func(b *testing.B) (base string, toks []fencing.Token, done func())) {
		b.Run(name, func(b *testing.B) {
			base, toks, done := setup(b)
			defer done()
			rps, p50, p99 := load(b, base, toks)
			if name == "direct" {
				direct = rps
			}
			b.ReportMetric(rps, "req/s")
			b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
			b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
			if direct > 0 {
				b.ReportMetric(rps/direct, "rps/direct")
			}
		})
	}
	noToks := make([]fencing.Token, resources)
	for i := range noToks {
		noToks[i] = 1
	}
	run("direct", func(b *testing.B) (string, []fencing.Token, func()) {
		return up.URL, noToks, func() {}
	})
	run("reverseproxy", func(b *testing.B) (string, []fencing.Token, func()) {
		rp := &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
			Transport: &http.Transport{MaxIdleConnsPerHost: 256},
		}
		s := httptest.NewServer(rp)
		return s.URL, noToks, s.Close
	})
	run("gate-memory", func(b *testing.B) (string, []fencing.Token, func()) {
		st := memstore.New(memstore.Options{})
		s := serveGate(b, gate(b, st))
		return s.URL, hold(b, st), s.Close
	})
	// gate-memory-telemetry is gate-memory as fencegate serve runs it
	// without OTLP: SDK metrics (store histogram, write counter, HTTP
	// metrics) and a no-op tracer.
	run("gate-memory-telemetry", func(b *testing.B) (string, []fencing.Token, func()) {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		st := storemetrics.Wrap(memstore.New(memstore.Options{}), mp, nil)
		g, err := New(Options{Upstream: u, Store: st, Rules: rules, MeterProvider: mp})
		if err != nil {
			b.Fatal(err)
		}
		s := serveGate(b, g)
		return s.URL, hold(b, st), s.Close
	})
	run("gate-file", func(b *testing.B) (string, []fencing.Token, func()) {
		st, err := boltstore.Open(filepath.Join(b.TempDir(), "fencegate.db"), boltstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		s := serveGate(b, gate(b, st))
		return s.URL, hold(b, st), func() { s.Close(); _ = st.Close() }
	})
	// gate-valkey admits in a throwaway Valkey-compatible server on
	// loopback (skipped when none is installed): the many-gates store.
	run("gate-valkey", func(b *testing.B) (string, []fencing.Token, func()) {
		srv := valkeytest.Start(b)
		st, err := valkeystore.Open(context.Background(), valkeystore.Options{URL: srv.URL()})
		if err != nil {
			b.Fatal(err)
		}
		s := serveGate(b, gate(b, st))
		return s.URL, hold(b, st), func() { s.Close(); _ = st.Close() }
	})
}

// load sends b.N fenced writes to base from parallel clients and returns
// the throughput and latency percentiles.
func load(b *testing.B, base string, toks []fencing.Token) (rps float64, p50, p99 time.Duration) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var lat []time.Duration
	var seq sync.Mutex
	next := 0
	b.SetParallelism(4)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			seq.Lock()
			i := next % len(toks)
			next++
			seq.Unlock()
			req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/jobs/%d", base, i), strings.NewReader(`{"step":1}`))
			req.Header.Set(HeaderToken, toks[i].String())
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			local = append(local, time.Since(t0))
			if resp.StatusCode != http.StatusNoContent {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
		mu.Lock()
		lat = append(lat, local...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lat)
	return float64(len(lat)) / elapsed.Seconds(), lat[len(lat)*50/100], lat[len(lat)*99/100]
}
