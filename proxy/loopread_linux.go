//go:build linux

package proxy

import (
	"io"
	"net/http"

	"github.com/fencegate/fencegate/fencing/barrier"
	"github.com/fencegate/fencegate/internal/h1"
)

// Reading a request and deciding on it: the head (parsed by h1 into the
// connection's loopRequest), its Content-Length body, the gate's decision
// and admission, and the hand-over to the upstream phase
// (loopupstream_linux.go) at the end of the pass.

// readHead waits for a request head and parses it.
func (c *loopConn) readHead() bool {
	s := c.l.e.s
	for {
		if end := h1.HeadEnd(c.In); end >= 0 {
			return c.parseHead(end)
		}
		if len(c.In) >= s.maxHead || h1.BareLineEnd(c.In) {
			return c.handOver() // the general engine refuses it (431, 400) or waits for more
		}
		started := len(c.In) > 0
		if !c.Fill(c.l.buf) {
			if c.EOF {
				if len(c.In) == 0 {
					c.close()
				} else {
					return c.handOver() // a head cut short: the general engine answers it
				}
			}
			return false
		}
		if !started && c.served > 0 {
			// A keep-alive connection's next request: its head has
			// HeaderTimeout from its first byte, not IdleTimeout.
			c.enter(stHead) // now with bytes: the header timeout
		}
	}
}

// parseHead parses the head in c.In[:n] into the connection's request,
// with h1's strict parser, which accepts only heads net/http reads the
// same way (one valid Host among them). A head of MaxHeaderBytes or more
// (431 there), and a request outside the loop's plain subset, go to the
// fallback, whose parser and answers then judge them.
func (c *loopConn) parseHead(n int) bool {
	if n >= c.l.e.s.maxHead {
		return c.handOver()
	}
	if err := c.request.parse(c.In[:n]); err != nil || !c.plain() {
		return c.handOver()
	}
	c.In = c.In[n:]
	c.bodyLen = int(c.request.head.ContentLength)
	c.enter(stBody)
	return true
}

// plain reports whether the parsed request is one the loop forwards
// itself: a body of at most FENCEGATE_BODY_BUFFER bytes framed by its
// length, no CONNECT, and no Transfer-Encoding, Upgrade or Expect field,
// even empty.
func (c *loopConn) plain() bool {
	r := &c.request
	switch {
	case r.head.ContentLength < 0, r.head.ContentLength > int64(c.l.e.g.bodyBuffer):
		return false
	case string(r.head.Method) == http.MethodConnect:
		return false
	}
	for k := range r.fields() {
		switch string(k) {
		case "Transfer-Encoding", "Upgrade", "Expect":
			return false
		}
	}
	return true
}

// readBody waits for the request's body, then starts the exchange.
func (c *loopConn) readBody() bool {
	for len(c.In) < c.bodyLen {
		if !c.Fill(c.l.buf) {
			if c.EOF {
				c.start(io.ErrUnexpectedEOF)
				return true
			}
			return false
		}
	}
	if c.bodyLen > 0 {
		c.request.setBody(c.In[:c.bodyLen])
		c.In = c.In[c.bodyLen:]
	}
	c.start(nil)
	return true
}

// start runs the gate's decision on the request read (bodyErr: its body
// failed) and acts on it.
func (c *loopConn) start(bodyErr error) {
	g := c.l.e.g
	c.enter(stAdmit)
	x, d := g.open(c.l.e.ctx, &c.request, c.l.hdr, c.l.now) // the start of the loop's pass: one clock read less, as exact as a pass
	x.bodyErr = bodyErr
	c.x = x
	if hook := loopPanicHook.Load(); hook != nil {
		(*hook)(c)
	}
	switch p := g.verdict(x, d); {
	case p == passFence:
		t, now := g.admitNow(x, d)
		if now {
			c.forwardLater(t)
			return
		}
		// The store or the barrier would make the loop wait: the
		// admission goes to the store's next batch, or, like the wait
		// for its turn, on a goroutine.
		c.admitting = true
		if t == nil && g.batches(d) {
			c.l.queueAdmit(c, d)
			return
		}
		l := c.l
		l.e.goTracked(workAdmission, func() {
			var f flight
			ok := false
			if t != nil {
				f, ok = t, g.waitTurn(x, d.Targets[0], t, g.barrierTimeout)
			} else {
				f, ok = g.admitWrite(x, d)
			}
			if !l.post(func() { c.admitted(f, ok) }) {
				abandonAdmitted(g, x, f, ok) // the loop has stopped
			}
		})
	case p == passAnswered:
		c.answer()
	case bodyErr != nil:
		g.writeProblem(x, bodyProblem(bodyErr, false, false))
		c.answer()
	case p == passForward:
		c.forwardLater(nil)
	default: // passUpgrade: never, Upgrade heads are handed off
		g.writeProblem(x, bodyProblem(io.ErrUnexpectedEOF, false, false))
		c.answer()
	}
}

// forwardLater forwards the request (an admitted write and its place t,
// or a request the gate does not fence: nil) when the loop's pass over
// its ready sockets ends, together with the other requests the pass
// admitted (eventLoop.forwardPassed). The upstream then gets them in one
// burst of writes and wakes once for them, not once per request: measured
// at 50 connections, 5 to 15 % more writes per second for less CPU per
// write. A write waits at most one pass; it keeps its place in the
// barrier meanwhile, as while it is sent.
func (c *loopConn) forwardLater(t *barrier.Ticket) {
	c.admitting = true
	var f flight
	if t != nil {
		f = t
	}
	c.l.passed = append(c.l.passed, passedRequest{c: c, t: f})
}

// passedRequest is a request waiting for the end of the pass to be
// forwarded (see forwardLater).
type passedRequest struct {
	c *loopConn
	t flight // nil: not fenced
}

// abandonAdmitted ends write x, whose admission ran on a goroutine that
// found its loop stopped: admitted (ok), its place t is left, as admitted
// leaves it for a closed connection; it was never forwarded.
func abandonAdmitted(g *Gate, x *exchange, t flight, ok bool) {
	if ok && t != nil {
		t.Leave()
	}
	g.end(x)
}

// admitted goes on with a write whose admission ran elsewhere (a
// goroutine, a batch, or earlier in the pass: t nil when not fenced).
func (c *loopConn) admitted(t flight, ok bool) {
	c.l.touch(c)
	c.admitting = false
	if c.closed {
		if ok && t != nil {
			t.Leave() // admitted, never forwarded
		}
		c.l.e.g.end(c.x)
		c.x = nil
		return
	}
	if ok {
		c.forward(t)
	} else {
		c.answer()
	}
	c.run()
}
