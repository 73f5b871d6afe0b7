//go:build linux

package proxy

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/storemetrics"
)

// BenchmarkServe is the general engine's cost per fenced write (net/http's
// server and transport, as for the requests the loops hand over): a raw
// client on a kept-alive loopback connection sends PUT /jobs/{n} with its
// token, the memory store admits it at the mark, a raw upstream answers.
// The client and the upstream allocate nothing per write, so -benchmem
// reports the gate's own allocations; bare, and with the telemetry
// fencegate serve runs with (SDK metrics for the gate and the store, no
// tracing). BenchmarkLoopWrite is the same write on the event loops.
//
//	go test -run '^$' -bench Serve -benchmem ./proxy
func BenchmarkServe(b *testing.B) {
	b.Run("bare", func(b *testing.B) { benchmarkServe(b, false) })
	b.Run("telemetry", func(b *testing.B) { benchmarkServe(b, true) })
}

func benchmarkServe(b *testing.B, telemetry bool) {
	const resources = 64
	up := serveRawBench(b)
	rules, err := ParseRules("PUT /jobs/{id} fence job:{id}")
	if err != nil {
		b.Fatal(err)
	}
	var st fencing.Store = memstore.New(memstore.Options{})
	u, _ := url.Parse("http://" + up.Addr().String())
	opts := Options{Upstream: u, Rules: rules, Audit: Audit{Off: true}}
	if telemetry {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		st = storemetrics.Wrap(st, mp, nil)
		opts.MeterProvider, opts.ServerName = mp, "127.0.0.1:8080"
	}
	opts.Store = st
	g, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([][]byte, resources)
	for i := range reqs {
		l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: fmt.Sprintf("job:%d", i), Owner: "bench", TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		reqs[i] = fmt.Appendf(nil, "PUT /jobs/%d HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\nFencing-Token: %s\r\nContent-Length: 10\r\n\r\n{\"step\":1}", i, l.Token)
	}
	s := serveGateWith(b, g, ServerOptions{NoEventLoops: true})
	c := blockingConn(b, s.Listener.Addr().String())
	buf := make([]byte, 4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := c.Write(reqs[i%resources]); err != nil {
			b.Fatal(err)
		}
		if err := readAnswer(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}
