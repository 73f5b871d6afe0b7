package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/fencegate/fencegate/fencing/problem"
)

// forwardUpgrade forwards a read that asks for a protocol upgrade an
// upgrade rule allows (a WebSocket handshake) on a connection of its own:
// if the upstream switches protocols (101), the gate relays bytes both ways
// until either side closes; any other answer is relayed as a plain
// response and the upstream connection closed. Upgrades are reads: they
// are neither fenced nor counted as writes.
func (g *Gate) forwardUpgrade(x *exchange) {
	out := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(out)
	g.upstreamRequest(x, out, true)
	up, err := g.dialUpstream()
	if err != nil {
		g.upgradeFailed(x, err)
		return
	}
	_ = up.SetDeadline(time.Now().Add(g.upstreamTO))
	bw := bufio.NewWriter(up)
	br := bufio.NewReaderSize(up, upstreamReadBuffer)
	err = out.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err == nil {
		resp.SkipBody = true
		err = resp.Header.Read(br)
	}
	if err != nil {
		up.Close()
		g.upgradeFailed(x, err)
		return
	}
	if resp.StatusCode() != http.StatusSwitchingProtocols {
		// Not upgraded: relay the answer, body included, and drop the
		// connection.
		defer up.Close()
		resp.SkipBody = false
		if err := resp.ReadBody(br, 0); err != nil {
			g.upgradeFailed(x, err)
			return
		}
		responseHeader(x, resp)
		x.c.Response.SetBody(resp.Body())
		return
	}
	head := append([]byte(nil), resp.Header.Header()...)
	_ = up.SetDeadline(time.Time{})
	x.c.HijackSetNoResponse(true)
	x.c.Hijack(func(client net.Conn) {
		defer up.Close()
		if _, err := client.Write(head); err != nil {
			return
		}
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, client); closeWrite(up); done <- struct{}{} }()
		go func() { _, _ = io.Copy(client, br); closeWrite(client); done <- struct{}{} }()
		<-done
		<-done
	})
}

// closeWrite half-closes c when it can, so the other side sees the end of
// the stream; otherwise it closes c.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// dialUpstream opens a connection of its own to the upstream.
func (g *Gate) dialUpstream() (net.Conn, error) {
	c, err := g.client.Dial(g.client.Addr)
	if err != nil || !g.client.IsTLS {
		return c, err
	}
	cfg := g.client.TLSConfig.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = g.upstream.Hostname()
	}
	tc := tls.Client(c, cfg)
	_ = tc.SetDeadline(time.Now().Add(g.upstreamTO))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

func (g *Gate) upgradeFailed(x *exchange, err error) {
	p := problem.New(http.StatusBadGateway, "upstream-unavailable", "the upstream could not be reached or failed before answering")
	if isTimeout(err) {
		p = problem.New(http.StatusGatewayTimeout, "upstream-timeout", "the upstream did not answer in time")
	}
	p.Cause = err
	g.writeProblem(x, p)
}
