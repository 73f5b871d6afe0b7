//go:build linux

package proxy

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing/barrier"
	"github.com/fencegate/fencegate/fencing/reqid"
)

// connState is where a loop connection's current request is.
type connState int

const (
	stHead     connState = iota // reading a request's head (or idle between requests)
	stBody                      // reading its Content-Length body
	stAdmit                     // admission running on its own goroutine
	stUpstream                  // waiting for an upstream connection
	stSend                      // sending the request upstream
	stResponse                  // reading the upstream's response head
	stRelay                     // relaying the response body
	stClosing                   // writing the last answer, then closing
)

// loopConn is a client connection served by an event loop. It implements
// net.Conn only as far as fasthttp.RequestCtx asks (the addresses): the
// loop does the I/O.
type loopConn struct {
	sock
	l        *eventLoop
	remote   *net.TCPAddr
	state    connState
	deadline time.Time // of the current step; zero: none
	closed   bool

	out    []byte // to write to the client
	served int    // requests answered on this connection

	ctx      fasthttp.RequestCtx // the current request, reused
	x        *exchange
	t        flight // the write's place at the barrier, or nil
	bodyLen  int
	closeEnd bool // close once the current answer is written

	up      *upConn
	dialing bool
	queued  bool   // its next write waits for the end of the pass (see writeLater)
	req     []byte // the request as the upstream gets it
	sent    int    // bytes of req sent
	retried bool   // a read resent once on a new connection
	resp    fasthttp.Response
	relay   relayState
}

// relayState is the progress of a response body through the loop.
type relayState struct {
	noBody  bool
	left    int64 // Content-Length bytes still due; -1: chunked, -2: until the upstream closes
	chunked chunkScanner
}

func (c *loopConn) ready(ev uint32) {
	c.note(c.l, ev)
	c.run()
}

// run moves c's request on as far as its sockets allow.
func (c *loopConn) run() {
	for !c.closed {
		// A response head waits for the first of its body, to go in one
		// write: relayBody flushes.
		if c.state != stRelay && !c.flush() {
			return
		}
		var moved bool
		switch c.state {
		case stHead:
			moved = c.readHead()
		case stBody:
			moved = c.readBody()
		case stSend:
			moved = c.send()
		case stResponse:
			moved = c.readResponse()
		case stRelay:
			moved = c.relayBody()
		case stClosing:
			c.close()
			return
		default: // stAdmit, stUpstream: a post moves them
			return
		}
		if !moved {
			return
		}
	}
}

// flush writes c.out, or queues it for the end of the pass (see
// writeLater); false while some is left (or c failed).
func (c *loopConn) flush() bool {
	if len(c.out) > 0 && c.l.writeLater(c, &c.sock) {
		return false
	}
	return c.flushNow()
}

// flushNow writes c.out at once, as far as the socket takes it.
func (c *loopConn) flushNow() bool {
	n, err := c.write(c.l, c.out)
	if err != nil {
		c.close() // the client is gone
		return false
	}
	if n < len(c.out) {
		// The rest moves to the front, so the array is reused whole
		// once it is written (slicing past it would shrink it for good).
		c.out = c.out[:copy(c.out, c.out[n:])]
		return false
	}
	c.out = c.out[:0]
	return true
}

// sock is a loop's socket as the loop sees it: its edge-triggered
// readiness, remembered until a call returns EAGAIN, and what was read
// from it and not consumed yet.
type sock struct {
	fd       int
	in       []byte
	keep     []byte // the array in starts on, reused once in is consumed
	readable bool
	writable bool
	hup      bool // the peer closed or failed: read to the end
	eof      bool
}

// note records the readiness an epoll event reports; writable again after
// a blocked write, the socket is no longer watched for writing.
func (s *sock) note(l *eventLoop, ev uint32) {
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.readable = true
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.hup = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 && !s.writable {
		s.writable = true
		_ = l.watch(s.fd, unix.EPOLL_CTL_MOD, false)
	}
}

// write writes p to the socket until all of it is written, a write would
// block (the socket is then watched for writing until it is writable
// again), or a write fails; it returns how much it wrote.
func (s *sock) write(l *eventLoop, p []byte) (int, error) {
	n := 0
	for n < len(p) && s.writable {
		m, err := rawWrite(s.fd, p[n:])
		switch err {
		case nil:
			n += m
		case unix.EINTR:
		case unix.EAGAIN:
			s.writable = false
			_ = l.watch(s.fd, unix.EPOLL_CTL_MOD, true)
		default:
			return n, err
		}
	}
	return n, nil
}

// fill reads what the peer sent into s.in, through buf; false when
// nothing was read (EAGAIN, the end of the stream, or an error: eof).
func (s *sock) fill(buf []byte) bool {
	if !s.readable || s.eof {
		return false
	}
	n, err := rawRead(s.fd, buf)
	return s.took(buf, n, err)
}

// took records a read into buf that gave n bytes, or err: the bytes go to
// s.in, and the readiness follows (a short read drained the socket). It
// reports what fill reports.
func (s *sock) took(buf []byte, n int, err error) bool {
	switch {
	case err == unix.EINTR:
		return true
	case err == unix.EAGAIN:
		s.readable = false
		return false
	case err != nil || n == 0:
		s.eof = true
		s.readable = false
		return false
	}
	if n < len(buf) && !s.hup {
		s.readable = false // drained: the next byte is a new edge (the end of the stream is not)
	}
	if len(s.in) == 0 {
		if cap(s.keep) > keepBuffer {
			s.keep = nil // one large read does not pin its buffer
		}
		s.in = append(s.keep[:0], buf[:n]...)
		s.keep = s.in
	} else {
		s.in = append(s.in, buf[:n]...)
	}
	return true
}

// keepBuffer is the largest read buffer a socket keeps between reads.
const keepBuffer = 16 << 10

// readHead waits for a request head and parses it.
func (c *loopConn) readHead() bool {
	s := c.l.e.s
	for {
		end := bytes.Index(c.in, crlfcrlf)
		if end >= 0 {
			return c.parseHead(end + 4)
		}
		if len(c.in) >= s.maxHead || bareLineEnd(c.in) {
			c.l.handoff(c) // fasthttp refuses it (431, 400) or waits for more
			return false
		}
		started := len(c.in) > 0
		if !c.fill(c.l.buf) {
			if c.eof {
				if len(c.in) == 0 {
					c.close()
				} else {
					c.l.handoff(c) // a head cut short: fasthttp answers it
				}
			}
			return false
		}
		if !started && c.served > 0 {
			// A keep-alive connection's next request: its head has
			// HeaderTimeout from its first byte, not IdleTimeout.
			c.deadline = c.l.now.Add(s.headerTimeout)
		}
	}
}

var crlfcrlf = []byte("\r\n\r\n")

// bareLineEnd reports whether b has a CR not followed by LF, or an LF not
// preceded by CR, or a NUL: heads the loop leaves to fasthttp.
func bareLineEnd(b []byte) bool {
	for i, ch := range b {
		switch ch {
		case '\r':
			if i+1 < len(b) && b[i+1] != '\n' {
				return true
			}
		case '\n':
			if i == 0 || b[i-1] != '\r' {
				return true
			}
		case 0:
			return true
		}
	}
	return false
}

// parseHead parses the head in c.in[:n] with fasthttp's request parser; a
// request outside the loop's plain subset goes to the fallback.
func (c *loopConn) parseHead(n int) bool {
	l := c.l
	head := c.in[:n]
	if bareLineEnd(head) {
		l.handoff(c)
		return false
	}
	req := &c.ctx.Request
	req.Reset()
	c.ctx.Response.Reset()
	l.rd.Reset(head)
	l.br.Reset(&l.rd)
	err := req.Header.Read(l.br)
	if err != nil || l.br.Buffered() != 0 || l.rd.Len() != 0 || !c.plain() {
		l.handoff(c)
		return false
	}
	c.in = c.in[n:]
	c.bodyLen = max(req.Header.ContentLength(), 0)
	c.state = stBody
	c.deadline = l.now.Add(l.e.g.bodyTimeout)
	return true
}

// plain reports whether the parsed request is one the loop forwards
// itself.
func (c *loopConn) plain() bool {
	h := &c.ctx.Request.Header
	n := h.ContentLength()
	g := c.l.e.g
	switch {
	case !h.IsHTTP11(), n < 0 && n != -2, n > g.bodyBuffer, h.IsConnect():
		return false
	case len(h.Peek("Transfer-Encoding")) > 0, len(h.Peek("Upgrade")) > 0, len(h.Peek("Expect")) > 0:
		return false
	}
	return true
}

// readBody waits for the request's body, then starts the exchange.
func (c *loopConn) readBody() bool {
	for len(c.in) < c.bodyLen {
		if !c.fill(c.l.buf) {
			if c.eof {
				c.start(io.ErrUnexpectedEOF)
				return true
			}
			return false
		}
	}
	if c.bodyLen > 0 {
		c.ctx.Request.SetBody(c.in[:c.bodyLen])
		c.in = c.in[c.bodyLen:]
	}
	c.start(nil)
	return true
}

// start runs the gate's decision on the request read (bodyErr: its body
// failed) and acts on it.
func (c *loopConn) start(bodyErr error) {
	g := c.l.e.g
	c.deadline = time.Time{}
	x, d := g.open(&c.ctx, c.l.hdr, c.l.now) // the start of the loop's pass: one clock read less, as exact as a pass
	x.bodyErr = bodyErr
	c.x = x
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
		c.state = stAdmit
		if t == nil && g.batches(d) {
			c.l.queueAdmit(c, d)
			return
		}
		go func() {
			var f flight
			ok := false
			if t != nil {
				f, ok = t, g.waitTurn(x, d.Targets[0], t)
			} else {
				f, ok = g.admitWrite(x, d)
			}
			c.l.post(func() { c.admitted(f, ok) })
		}()
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
	c.state = stAdmit
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

// admitted goes on with a write whose admission ran elsewhere (a
// goroutine, a batch, or earlier in the pass: t nil when not fenced).
func (c *loopConn) admitted(t flight, ok bool) {
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

// forward prepares the request for the upstream and finds it a
// connection.
func (c *loopConn) forward(t flight) {
	g := c.l.e.g
	l := c.l
	c.t = t
	body := c.ctx.Request.Body()
	c.req = append(g.appendUpstreamHead(c.req[:0], c.x, len(body)), body...)
	c.sent = 0
	c.retried = false
	c.deadline = l.now.Add(g.upstreamTO)
	c.state = stUpstream
	if g.beforeSend != nil {
		go func() {
			g.beforeSend()
			l.post(func() {
				if !c.closed && c.state == stUpstream {
					l.upstream(c)
					c.run()
				}
			})
		}()
		return
	}
	l.upstream(c)
}

// send writes the request to the upstream connection, or queues it for
// the end of the pass (see writeLater).
func (c *loopConn) send() bool {
	if c.sent < len(c.req) && c.l.writeLater(c, &c.up.sock) {
		return false
	}
	n, err := c.up.write(c.l, c.req[c.sent:])
	c.sent += n
	switch {
	case err != nil:
		c.upstreamBroke(syscallErr("write", err))
		return true
	case c.sent < len(c.req):
		return false
	}
	c.state = stResponse
	return true
}

// readResponse waits for the upstream's response head, then sends the
// client its own.
func (c *loopConn) readResponse() bool {
	u := c.up
	l := c.l
	for {
		end := bytes.Index(u.in, crlfcrlf)
		if end < 0 {
			if len(u.in) > upstreamReadBuffer {
				c.upstreamBroke(errUpstreamHead)
				return true
			}
			if !u.fill(u.l.buf) {
				if u.eof {
					c.upstreamBroke(errUpstreamClosed)
					return true
				}
				return false
			}
			continue
		}
		head := u.in[:end+4]
		c.resp.Reset()
		l.rd.Reset(head)
		l.br.Reset(&l.rd)
		if err := c.resp.Header.Read(l.br); err != nil || l.br.Buffered() != 0 || l.rd.Len() != 0 {
			c.upstreamBroke(errUpstreamHead)
			return true
		}
		u.in = u.in[end+4:]
		status := c.resp.StatusCode()
		if status >= 100 && status < 200 {
			if status == http.StatusSwitchingProtocols {
				c.upstreamBroke(errUpstreamHead) // no upgrade was asked for
				return true
			}
			continue // an interim answer: the final one follows
		}
		c.answered()
		return true
	}
}

// answered relays the upstream's response head to the client and starts
// relaying its body. The upstream has answered: the barrier lets the next
// token through while the body is still relayed.
func (c *loopConn) answered() {
	g := c.l.e.g
	x := c.x
	if c.t != nil {
		c.t.Leave()
		c.t = nil
		x.audit.answered(c.resp.StatusCode())
		g.count(x, CodeAdmitted)
	}
	rh := &c.resp.Header
	r := relayState{left: int64(rh.ContentLength())}
	status := rh.StatusCode()
	r.noBody = c.ctx.Request.Header.IsHead() || status == http.StatusNoContent || status == http.StatusNotModified
	if rh.ConnectionClose() || r.left == -2 && !r.noBody {
		c.up.reusable = false
	} else {
		c.up.reusable = true
	}
	r.chunked = chunkScanner{}
	c.relay = r
	x.c.Response.SetStatusCode(status) // for the telemetry of end
	if c.ctx.Request.Header.ConnectionClose() || c.l.e.closing.Load() {
		c.closeEnd = true
	}
	rh.SetNoDefaultContentType(true) // none is added where the upstream sent none
	c.out = appendResponseHead(c.out, rh, x.id, r, c.closeEnd)
	c.state = stRelay
}

// appendResponseHead serializes a response head for the client: status,
// the headers h holds except the framing ones, then the framing r says.
// With a request id, h is the upstream's head, written as responseHeader
// and this function would write it together on the fasthttp path, without
// copying it first: the hop-by-hop headers and those its Connection header
// names are left out, and X-Request-Id is id (in the upstream's place for
// it, or last).
func appendResponseHead(dst []byte, h *fasthttp.ResponseHeader, id string, r relayState, closeConn bool) []byte {
	var named []string // the headers the upstream's Connection names
	if id != "" {
		named = connectionNamed(h.All())
	}
	idDone := id == ""
	status := h.StatusCode()
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	if m := h.StatusMessage(); len(m) > 0 {
		dst = append(dst, m...)
	} else {
		dst = append(dst, fasthttp.StatusMessage(status)...)
	}
	dst = append(dst, "\r\n"...)
	for k, v := range h.All() {
		switch string(k) {
		case "Content-Length", "Transfer-Encoding", "Connection":
			continue
		}
		if id != "" {
			if isHopHeader(k) || nameIn(k, named) {
				continue
			}
			if string(k) == reqid.Header { // the gate's, once, where the upstream's first was
				if idDone {
					continue
				}
				v, idDone = []byte(id), true
			}
		}
		dst = append(append(append(append(dst, k...), ": "...), v...), "\r\n"...)
	}
	if !idDone {
		dst = append(append(append(append(dst, reqid.Header...), ": "...), id...), "\r\n"...)
	}
	switch {
	case r.left >= 0 && (!r.noBody || len(h.Peek("Content-Length")) > 0):
		if status != http.StatusNoContent && status >= 200 {
			dst = append(dst, "Content-Length: "...)
			dst = strconv.AppendInt(dst, r.left, 10)
			dst = append(dst, "\r\n"...)
		}
	case r.left < 0 && !r.noBody: // chunked, or until the upstream closes: chunked to the client
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	}
	if closeConn {
		dst = append(dst, "Connection: close\r\n"...)
	}
	return append(dst, "\r\n"...)
}

// relayBody moves the response body from the upstream to the client.
func (c *loopConn) relayBody() bool {
	u := c.up
	r := &c.relay
	for {
		if !c.take() {
			return false
		}
		if r.noBody || r.left == 0 {
			break
		}
		if len(c.out) >= loopReadBuffer && !c.flush() {
			return false // the client reads slowly: wait for it
		}
		if !u.fill(u.l.buf) {
			if u.eof && r.left == -2 {
				u.reusable = false
				c.out = append(c.out, "0\r\n\r\n"...)
				break // the end of a body delimited by the close
			}
			if u.eof {
				c.cutOff() // the upstream broke off its answer
			} else if !c.flush() {
				return false
			}
			return false
		}
	}
	if len(u.in) > 0 {
		u.reusable = false // bytes past the response's end
	}
	c.finish()
	return true
}

// take moves the body bytes the upstream sent so far to c.out; false when
// their framing is broken (c is then cut off).
func (c *loopConn) take() bool {
	u := c.up
	r := &c.relay
	if r.noBody || r.left == 0 || len(u.in) == 0 {
		return true
	}
	p := u.in
	switch {
	case r.left == -2: // chunked here: the client's connection stays open
		c.out = strconv.AppendInt(c.out, int64(len(p)), 16)
		c.out = append(append(append(c.out, "\r\n"...), p...), "\r\n"...)
		u.in = u.in[:0]
		return true
	case r.left > 0:
		p = p[:min(int64(len(p)), r.left)]
		r.left -= int64(len(p))
	case r.left == -1:
		n, done, err := r.chunked.scan(p)
		if err != nil {
			c.cutOff()
			return false
		}
		p = p[:n]
		if done {
			r.left = 0
		}
	}
	c.out = append(c.out, p...)
	u.in = u.in[len(p):]
	return true
}

// answer sends the answer the gate set on the exchange (a refusal, a
// problem) and ends it.
func (c *loopConn) answer() {
	resp := &c.x.c.Response
	h := &resp.Header
	h.SetNoDefaultContentType(true)
	body := resp.Body()
	if h.ConnectionClose() || c.ctx.Request.Header.ConnectionClose() || c.x.bodyErr != nil || c.l.e.closing.Load() {
		c.closeEnd = true // asked for, the body's framing is lost, or the server is stopping
	}
	c.out = appendResponseHead(c.out, h, "", relayState{left: int64(len(body))}, c.closeEnd)
	c.out = append(c.out, body...)
	c.finish()
}

// finish ends the current exchange: the upstream connection goes back to
// the pool, and c waits for its next request.
func (c *loopConn) finish() {
	if u := c.detach(); u != nil {
		if u.reusable && len(u.in) == 0 && !c.l.e.closing.Load() {
			u.release()
		} else {
			u.close()
		}
	}
	if c.x != nil {
		c.l.e.g.end(c.x)
		c.x = nil
	}
	c.served++
	c.ctx.Request.Reset()
	c.ctx.Response.Reset()
	if c.closeEnd || c.eof {
		c.state = stClosing
		c.deadline = c.l.now.Add(c.l.e.s.headerTimeout) // to write the answer
		return
	}
	c.state = stHead
	c.deadline = c.l.now.Add(c.l.e.s.idleTimeout)
	if len(c.in) > 0 {
		c.deadline = c.l.now.Add(c.l.e.s.headerTimeout)
	}
}

// detach takes c's upstream connection from it, if it has one.
func (c *loopConn) detach() *upConn {
	u := c.up
	if u != nil {
		c.up = nil
		u.client = nil
	}
	return u
}

// upstreamFailed answers a request whose exchange with the upstream
// failed before any answer (see Gate.upstreamFailed).
func (c *loopConn) upstreamFailed(err error) {
	if u := c.detach(); u != nil {
		u.close()
	}
	t := c.t
	c.t = nil
	c.l.e.g.upstreamFailed(c.x, t, err)
	c.answer()
}

// upstreamBroke handles the upstream connection failing after the request
// was (maybe partly) sent and before the response head: a read is sent
// again once on a new connection when the failed one was a pooled one (it
// may have been closed by the upstream while idle); a write never is.
func (c *loopConn) upstreamBroke(err error) {
	u := c.up
	if u != nil && u.reused && !c.retried && len(u.in) == 0 && safeMethod(c.x.method) && err != errUpstreamHead {
		c.detach().close()
		c.retried = true
		c.sent = 0
		c.state = stUpstream
		c.l.dial(c)
		return
	}
	c.upstreamFailed(err)
}

// cutOff ends an exchange whose response body cannot be relayed: the
// client's connection is closed mid-answer, as the general path does.
func (c *loopConn) cutOff() {
	c.flushNow() // what came before the break, as far as the socket takes it
	c.close()
}

// expire fires c's deadline.
func (c *loopConn) expire() {
	switch c.state {
	case stHead:
		if len(c.in) == 0 {
			c.close() // idle, or nothing sent in time
			return
		}
		c.out = append(c.out, headTimeoutProblem().Response()...)
		c.state = stClosing
		c.deadline = c.l.now.Add(time.Second)
	case stBody:
		c.start(os.ErrDeadlineExceeded)
	case stUpstream:
		if c.dialing {
			c.dialing = false // the dial's result is dropped
			c.upstreamFailed(errDialTimeout)
		} else {
			c.l.unqueue(c)
			c.upstreamFailed(errNoFreeConns)
		}
	case stSend, stResponse:
		c.upstreamFailed(os.ErrDeadlineExceeded)
	case stRelay, stClosing:
		c.close()
		return
	default:
		return
	}
	c.run()
}

// close closes c and ends what it was doing.
func (c *loopConn) close() {
	if c.closed {
		return
	}
	c.closed = true
	c.l.forget(c)
	unix.Close(c.fd)
	c.l.e.s.limit.Release()
	if u := c.detach(); u != nil {
		u.close()
	}
	c.dialing = false
	if c.x != nil && c.state != stAdmit { // an admission ends it itself
		if c.t != nil {
			c.t.Hold(c.l.e.g.grace) // the write may be in the upstream
			c.t = nil
			c.l.e.g.count(c.x, CodeClientGone)
		}
		c.l.e.g.end(c.x)
		c.x = nil
	}
}

// The loop's net.Conn, for fasthttp.RequestCtx: addresses only.
func (c *loopConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (c *loopConn) Write(p []byte) (int, error)      { return 0, io.ErrClosedPipe }
func (c *loopConn) Close() error                     { return nil }
func (c *loopConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *loopConn) RemoteAddr() net.Addr             { return c.remote }
func (c *loopConn) SetDeadline(time.Time) error      { return nil }
func (c *loopConn) SetReadDeadline(time.Time) error  { return nil }
func (c *loopConn) SetWriteDeadline(time.Time) error { return nil }

// upConn is a connection to the upstream, owned by a loop: attached to one
// client connection while a request uses it, idle in the pool otherwise.
type upConn struct {
	sock
	l         *eventLoop
	client    *loopConn
	reused    bool // it served a request before
	reusable  bool // it may serve another after this one
	idleSince time.Time
	closed    bool
}

func (u *upConn) ready(ev uint32) {
	u.note(u.l, ev)
	if c := u.client; c != nil {
		c.run()
		return
	}
	// Idle: anything from the upstream now (its close, or bytes no
	// request asked for, maybe read ahead) ends the connection.
	if len(u.in) > 0 || u.eof || u.readable && (u.fill(u.l.buf) || u.eof) {
		u.close()
	}
}

// attach gives u to c's request.
func (u *upConn) attach(c *loopConn) {
	u.client = c
	c.up = u
	c.state = stSend
}

// release returns u to its loop's pool, or to a request waiting for one.
func (u *upConn) release() {
	l := u.l
	u.reused = true
	u.in = u.in[:0]
	if len(l.waiting) > 0 {
		c := popFront(&l.waiting)
		u.attach(c)
		c.run()
		return
	}
	u.idleSince = l.now
	l.idle = append(l.idle, u)
}

func (u *upConn) close() {
	if u.closed {
		return
	}
	u.closed = true
	l := u.l
	for i, v := range l.idle {
		if v == u {
			l.idle = append(l.idle[:i], l.idle[i+1:]...)
			break
		}
	}
	delete(l.fds, u.fd)
	unix.Close(u.fd)
	l.e.upConns.Add(-1)
}

// chunkScanner follows a chunked body's framing (RFC 9112 §7.1) as it is
// relayed byte for byte, to find where it ends.
type chunkScanner struct {
	state int
	size  int64
}

const (
	chunkSize = iota
	chunkExt
	chunkSizeLF
	chunkData
	chunkDataCR
	chunkDataLF
	chunkTrailer     // at the start of a trailer line (or the final CRLF)
	chunkTrailerLine // inside a trailer line
	chunkTrailerLF   // after a trailer line's CR
	chunkFinalLF     // after the final CR
	chunkSizeDigits  // inside the size, after one digit
)

// scan consumes p; it returns how many bytes belong to the body (all of p
// unless the body ends inside it) and whether the body ended.
func (s *chunkScanner) scan(p []byte) (int, bool, error) {
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch s.state {
		case chunkSize, chunkSizeDigits:
			switch {
			case isHex(b):
				// One more digit would overflow int64 (its largest
				// value is 1<<63-1): refused, at any length of
				// leading zeros.
				if s.size >= 1<<59 {
					return 0, false, errUpstreamBody
				}
				s.size = s.size<<4 | int64(unhex(b))
				s.state = chunkSizeDigits
			case s.state == chunkSize:
				return 0, false, errUpstreamBody
			case b == ';' || b == ' ' || b == '\t':
				s.state = chunkExt
			case b == '\r':
				s.state = chunkSizeLF
			default:
				return 0, false, errUpstreamBody
			}
		case chunkExt:
			if b == '\r' {
				s.state = chunkSizeLF
			} else if b == '\n' {
				return 0, false, errUpstreamBody
			}
		case chunkSizeLF:
			if b != '\n' {
				return 0, false, errUpstreamBody
			}
			if s.size == 0 {
				s.state = chunkTrailer
			} else {
				s.state = chunkData
			}
		case chunkData:
			n := min(int64(len(p)-i), s.size)
			s.size -= n
			i += int(n) - 1
			if s.size == 0 {
				s.state = chunkDataCR
			}
		case chunkDataCR:
			if b != '\r' {
				return 0, false, errUpstreamBody
			}
			s.state = chunkDataLF
		case chunkDataLF:
			if b != '\n' {
				return 0, false, errUpstreamBody
			}
			s.state = chunkSize
		case chunkTrailer:
			if b == '\r' {
				s.state = chunkFinalLF
			} else if b == '\n' {
				return 0, false, errUpstreamBody
			} else {
				s.state = chunkTrailerLine
			}
		case chunkTrailerLine:
			if b == '\r' {
				s.state = chunkTrailerLF
			} else if b == '\n' {
				return 0, false, errUpstreamBody
			}
		case chunkTrailerLF:
			if b != '\n' {
				return 0, false, errUpstreamBody
			}
			s.state = chunkTrailer
		case chunkFinalLF:
			if b != '\n' {
				return 0, false, errUpstreamBody
			}
			return i + 1, true, nil
		}
	}
	return len(p), false, nil
}
