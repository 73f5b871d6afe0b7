//go:build linux

package proxy

import (
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing/barrier"
	"github.com/fencegate/fencegate/fencing/reqid"
	"github.com/fencegate/fencegate/internal/h1"
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
	fdClosed bool // its descriptor is closed
	touched  bool // in its loop's touched list (loopguard_linux.go)

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
	relay   relayState
}

// relayState is the progress of a response body through the loop.
type relayState struct {
	noBody  bool
	left    int64 // Content-Length bytes still due, h1.Chunked or h1.UntilClose
	chunked h1.ChunkScanner
}

func (c *loopConn) ready(ev uint32) {
	c.l.touch(c)
	c.note(c.l, ev)
	c.run()
}

// run moves c's request on as far as its sockets allow.
func (c *loopConn) run() {
	c.l.touch(c)
	for !c.closed {
		if c.err != nil || c.up != nil && c.up.err != nil {
			c.sockFailed()
			return
		}
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

// sockFailed ends c's exchange after the loop lost track of one of its
// sockets (sock.broke): the client's closes c; the upstream's fails the
// exchange as a broken upstream connection would, or cuts off a relay.
func (c *loopConn) sockFailed() {
	if c.err != nil {
		c.close()
		return
	}
	switch c.state {
	case stSend, stResponse:
		c.upstreamBroke(c.up.err)
	default:
		c.cutOff()
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
	err      error // the loop could not change its epoll registration: its owner closes it
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
		if err := l.watch(s.fd, unix.EPOLL_CTL_MOD, false); err != nil {
			s.broke(err)
		}
	}
}

// broke records that s's epoll registration could not be changed: s is
// then neither read nor written, and its owner closes it (a socket whose
// readiness the loop can no longer follow would stall to its deadline).
func (s *sock) broke(err error) {
	if s.err == nil {
		s.err = syscallErr("epoll_ctl", err)
	}
	s.readable, s.writable, s.eof = false, false, true
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
			if err := l.watch(s.fd, unix.EPOLL_CTL_MOD, true); err != nil {
				s.broke(err)
				return n, s.err
			}
		default:
			return n, err
		}
	}
	return n, s.err
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
		if end := h1.HeadEnd(c.in); end >= 0 {
			return c.parseHead(end)
		}
		if len(c.in) >= s.maxHead || h1.BareLineEnd(c.in) {
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

// parseHead parses the head in c.in[:n]: first with h1's strict parser,
// which accepts only heads net/http reads the same way (one valid Host
// among them), then with fasthttp's request parser, which fills the
// request the gate decides on; the two must agree on the body's length. A
// request outside the loop's plain subset goes to the fallback, whose
// parser and answers then judge it.
func (c *loopConn) parseHead(n int) bool {
	l := c.l
	head := c.in[:n]
	if err := h1.ParseRequest(head, &l.head); err != nil || l.head.ContentLength < 0 {
		l.handoff(c)
		return false
	}
	req := &c.ctx.Request
	req.Reset()
	c.ctx.Response.Reset()
	l.rd.Reset(head)
	l.br.Reset(&l.rd)
	err := req.Header.Read(l.br)
	if err != nil || l.br.Buffered() != 0 || l.rd.Len() != 0 || !c.plain() ||
		int64(max(req.Header.ContentLength(), 0)) != l.head.ContentLength {
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
		c.state = stAdmit
		if t == nil && g.batches(d) {
			c.l.queueAdmit(c, d)
			return
		}
		l := c.l
		l.e.goTracked(func() {
			var f flight
			ok := false
			if t != nil {
				f, ok = t, g.waitTurn(x, d, t)
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
		l.e.goTracked(func() {
			g.beforeSend()
			l.post(func() { // refused once the loop has stopped: closeAll closed c, holding its place
				if !c.closed && c.state == stUpstream {
					l.upstream(c)
					c.run()
				}
			})
		})
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
		end := h1.HeadEnd(u.in)
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
		// The head's fields alias u.in until answered has copied them
		// to c.out, before u reads again.
		if err := h1.ParseResponse(u.in[:end], &l.resp); err != nil {
			c.upstreamBroke(errUpstreamHead)
			return true
		}
		u.in = u.in[end:]
		status := l.resp.Status
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
	rh := &c.l.resp
	status := rh.Status
	if c.t != nil {
		c.t.Leave()
		c.t = nil
		x.audit.answered(status)
		g.count(x, CodeAdmitted)
	}
	r := relayState{left: rh.ContentLength}
	r.noBody = c.ctx.Request.Header.IsHead() || status == http.StatusNoContent || status == http.StatusNotModified
	c.up.reusable = !rh.Close && (r.left != h1.UntilClose || r.noBody)
	c.relay = r
	x.c.Response.SetStatusCode(status) // for the telemetry of end
	if c.ctx.Request.Header.ConnectionClose() || c.l.e.closing.Load() {
		c.closeEnd = true
	}
	c.out = appendRelayHead(c.out, rh, x.id, r, c.closeEnd)
	c.state = stRelay
}

// appendRelayHead serializes the upstream's response head h for the
// client: its status, its fields but for the framing ones, the hop-by-hop
// ones and those its Connection fields name, X-Request-Id as id (in the
// upstream's place for it, or last), then the framing r says. These are
// the bytes the general path writes for the same head (responseHeader).
func appendRelayHead(dst []byte, h *h1.Response, id string, r relayState, closeConn bool) []byte {
	var named []string // the headers the upstream's Connection names
	for _, f := range h.Fields {
		if strings.EqualFold(string(f.Name), "Connection") {
			named = append(named, connectionOptions(f.Value)...)
		}
	}
	dst = appendStatusLine(dst, h.Status, h.Reason)
	idDone := false
	hasLength := false
	for _, f := range h.Fields {
		k, v := f.Name, f.Value
		if strings.EqualFold(string(k), "Content-Length") {
			hasLength = true
			continue
		}
		if isHopHeader(k) || nameIn(k, named) {
			continue // Transfer-Encoding and Connection among them
		}
		if strings.EqualFold(string(k), reqid.Header) { // the gate's, once, where the upstream's first was
			if idDone {
				continue
			}
			k, v, idDone = reqIDName, []byte(id), true
		}
		dst = h1.AppendField(dst, k, v)
	}
	if !idDone {
		dst = h1.AppendField(dst, reqIDName, []byte(id))
	}
	return appendFraming(dst, h.Status, r, hasLength, closeConn)
}

// reqIDName is the request id's header name as the gate writes it.
var reqIDName = []byte(reqid.Header)

// appendStatusLine writes a status line as the general path does: the
// reason given, or fasthttp's for the status.
func appendStatusLine(dst []byte, status int, reason []byte) []byte {
	if len(reason) > 0 {
		return h1.AppendStatusLine(dst, status, reason)
	}
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(append(dst, ' '), fasthttp.StatusMessage(status)...)
	return append(dst, "\r\n"...)
}

// appendFraming ends a head with the body's framing as r says (a length,
// or chunked to the client for a chunked body or one delimited by the
// upstream's close), Connection: close when asked, and the empty line. A
// body-less answer keeps a Content-Length its source had (hasLength), as a
// HEAD's answer does.
func appendFraming(dst []byte, status int, r relayState, hasLength, closeConn bool) []byte {
	switch {
	case r.left >= 0 && (!r.noBody || hasLength):
		if status != http.StatusNoContent && status >= 200 {
			dst = h1.AppendContentLength(dst, r.left)
		}
	case r.left < 0 && !r.noBody:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	}
	if closeConn {
		dst = append(dst, "Connection: close\r\n"...)
	}
	return append(dst, "\r\n"...)
}

// appendAnswerHead serializes the head of an answer the gate made itself
// (a refusal, a problem): its status and fields, then the framing r says.
func appendAnswerHead(dst []byte, h *fasthttp.ResponseHeader, r relayState, closeConn bool) []byte {
	dst = appendStatusLine(dst, h.StatusCode(), h.StatusMessage())
	for k, v := range h.All() {
		switch string(k) {
		case "Content-Length", "Transfer-Encoding", "Connection":
			continue
		}
		dst = h1.AppendField(dst, k, v)
	}
	return appendFraming(dst, h.StatusCode(), r, len(h.Peek("Content-Length")) > 0, closeConn)
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
			if u.eof && r.left == h1.UntilClose {
				u.reusable = false
				c.out = append(c.out, h1.LastChunk...)
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
	case r.left == h1.UntilClose: // chunked here: the client's connection stays open
		c.out = h1.AppendChunkHeader(c.out, len(p))
		c.out = append(append(c.out, p...), "\r\n"...)
		u.in = u.in[:0]
		return true
	case r.left > 0:
		p = p[:min(int64(len(p)), r.left)]
		r.left -= int64(len(p))
	case r.left == h1.Chunked:
		n, done, err := r.chunked.Scan(p)
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
	c.out = appendAnswerHead(c.out, h, relayState{left: int64(len(body))}, c.closeEnd)
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
	c.l.touch(c)
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
			c.upstreamFailed(fasthttp.ErrDialTimeout)
		} else {
			c.l.unqueue(c)
			c.upstreamFailed(fasthttp.ErrNoFreeConns)
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
	c.fdClosed = true
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
	if u.err != nil {
		u.close()
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
