package proxy

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/storemetrics"
)

// BenchmarkServe is the gate's own cost per fenced write, without the
// network: client, gate and upstream talk over in-memory pipes, the store
// is the memory store, and each write is admitted at the mark. It reports
// the gate's allocations per write (-benchmem; the client's and the
// upstream's are included, and are fasthttp's, near zero), bare and with
// the telemetry fencegate serve runs with (SDK metrics for the gate and
// the store, no tracing).
//
//	go test -run '^$' -bench Serve -benchmem ./proxy
func BenchmarkServe(b *testing.B) {
	b.Run("bare", func(b *testing.B) { benchmarkServe(b, false) })
	b.Run("telemetry", func(b *testing.B) { benchmarkServe(b, true) })
}

func benchmarkServe(b *testing.B, telemetry bool) {
	upLn := fasthttputil.NewInmemoryListener()
	up := &fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) { c.SetStatusCode(fasthttp.StatusNoContent) }}
	go func() { _ = up.Serve(upLn) }()
	defer upLn.Close()

	u, _ := url.Parse("http://upstream")
	rules, err := ParseRules("PUT /jobs/{id} fence job:{id}")
	if err != nil {
		b.Fatal(err)
	}
	var st fencing.Store = memstore.New(memstore.Options{})
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
	g.pooled.Transport.(*http.Transport).DialContext = func(context.Context, string, string) (net.Conn, error) { return upLn.Dial() }
	gateLn := fasthttputil.NewInmemoryListener()
	srv := NewServer(g, ServerOptions{})
	go func() { _ = srv.Serve(gateLn) }()
	defer gateLn.Close()

	const resources = 64
	toks := make([]string, resources)
	for i := range toks {
		l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:" + strconv.Itoa(i), Owner: "bench", TTL: 3600e9})
		if err != nil {
			b.Fatal(err)
		}
		toks[i] = l.Token.String()
	}
	client := &fasthttp.HostClient{Addr: "gate", Dial: func(string) (net.Conn, error) { return gateLn.Dial() }}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		i := 0
		for pb.Next() {
			i = (i + 1) % resources
			req.Reset()
			req.Header.SetMethod(fasthttp.MethodPut)
			req.SetRequestURI("http://gate/jobs/" + strconv.Itoa(i))
			req.Header.Set(HeaderToken, toks[i])
			req.SetBodyString(`{"step":1}`)
			if err := client.Do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusNoContent {
				b.Errorf("write: %v %d %s", err, resp.StatusCode(), resp.Body())
				return
			}
		}
	})
}
