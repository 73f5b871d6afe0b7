//go:build linux

package proxy

import (
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/fencing/reqid"
	"github.com/fencegate/fencegate/internal/h1"
)

// Relaying the answer: the upstream's head rewritten for the client, its
// body moved as it comes (by its length, chunked framing as h1's scanner
// follows it, or to the upstream's close, re-framed as chunked), the
// gate's own answers, and the end of an exchange.

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
	r.noBody = c.request.isHead() || status == http.StatusNoContent || status == http.StatusNotModified
	c.up.reusable = !rh.Close && (r.left != h1.UntilClose || r.noBody)
	c.relay = r
	x.c.status = status // for the telemetry of end
	if c.request.closeAfter() || c.l.e.closing.Load() {
		c.closeEnd = true
	}
	c.out = appendRelayHead(c.out, rh, x.id, r, c.closeEnd)
	c.enter(stRelay)
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

// appendStatusLine writes a status line: the reason given, or else as
// net/http writes one (the status's text, or "status code N").
func appendStatusLine(dst []byte, status int, reason []byte) []byte {
	if len(reason) > 0 {
		return h1.AppendStatusLine(dst, status, reason)
	}
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	if text := http.StatusText(status); text != "" {
		dst = append(dst, text...)
	} else {
		dst = strconv.AppendInt(append(dst, "status code "...), int64(status), 10)
	}
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
// (a refusal, a problem): its status, the request id, its fields in the
// order of their names, then the framing r says (an answer to a HEAD,
// r.noBody, still says its body's length).
func appendAnswerHead(dst []byte, status int, id string, h http.Header, r relayState, closeConn bool) []byte {
	dst = appendStatusLine(dst, status, nil)
	dst = h1.AppendField(dst, reqIDName, []byte(id))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Connection", reqid.Header:
			continue
		}
		for _, v := range h[k] {
			dst = h1.AppendField(dst, []byte(k), []byte(v))
		}
	}
	return appendFraming(dst, status, r, r.noBody, closeConn)
}

// relayWindow is the most of an answer's body a connection holds for its
// client (32 KiB, as nginx's default proxy buffers): the relay writes it
// out once it holds relayWindow/2, and a client that does not take it
// stops the reading of the upstream, whose kernel buffers then hold the
// rest. A thousand clients that never read thus hold some 32 MiB.
const relayWindow = 32 << 10

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
		if len(c.out) >= relayWindow/2 && !c.flush() {
			u.Consumed() // its bytes are in c.out: do not pin them twice
			return false // the client reads slowly: wait for it
		}
		if !c.readAnswer() {
			if u.EOF && r.left == h1.UntilClose {
				u.reusable = false
				c.out = append(c.out, h1.LastChunk...)
				break // the end of a body delimited by the close
			}
			if u.EOF {
				c.cutOff() // the upstream broke off its answer
			} else if !c.flush() {
				return false
			}
			return false
		}
	}
	if len(u.In) > 0 {
		u.reusable = false // bytes past the response's end
	} else if u.reusable && u.Readable && !u.EOF {
		// The last read filled its buffer exactly (a body read to its
		// end, not past it): bytes the upstream sent after the response
		// may wait in the socket, whose readiness edge has come already,
		// so the idle pool would not see them. One more read tells.
		if u.Fill(u.l.buf[:1]) || u.EOF {
			u.reusable = false
		}
	}
	c.finish()
	return true
}

// readAnswer reads more of the answer's body from the upstream, up to the
// relay window: a body of known length straight into c.out, which saves a
// copy (and never reads past its end); any other through u.In, which take
// then moves. false as evloop.Sock.Fill.
func (c *loopConn) readAnswer() bool {
	u := c.up
	room := relayWindow - len(c.out) // above relayWindow/2: c.out was flushed below it
	if left := c.relay.left; left > 0 && len(u.In) == 0 {
		room = int(min(int64(room), left))
		c.out = slices.Grow(c.out, room)
		n, ok := u.ReadInto(c.out[len(c.out) : len(c.out)+room])
		c.out = c.out[:len(c.out)+n]
		c.relay.left -= int64(n)
		return ok
	}
	return u.Fill(u.l.buf[:room])
}

// take moves the body bytes the upstream sent so far to c.out; false when
// their framing is broken (c is then cut off).
func (c *loopConn) take() bool {
	u := c.up
	r := &c.relay
	if r.noBody || r.left == 0 || len(u.In) == 0 {
		return true
	}
	p := u.In
	switch {
	case r.left == h1.UntilClose: // chunked here: the client's connection stays open
		c.out = h1.AppendChunkHeader(c.out, len(p))
		c.out = append(append(c.out, p...), "\r\n"...)
		u.In = u.In[:0]
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
	u.In = u.In[len(p):]
	return true
}

// answer sends the answer the gate set on the exchange (a refusal, a
// problem) and ends it.
func (c *loopConn) answer() {
	r := &c.request
	body := r.answerBody
	if r.answerClose() || r.closeAfter() || c.x.bodyErr != nil || c.l.e.closing.Load() {
		c.closeEnd = true // asked for, the body's framing is lost, or the server is stopping
	}
	// A HEAD's answer says the body's length and sends none, as net/http
	// answers it: a body after it would be read as the next answer.
	head := r.isHead()
	c.out = appendAnswerHead(c.out, r.status, c.x.id, r.answer, relayState{left: int64(len(body)), noBody: head}, c.closeEnd)
	if !head {
		c.out = append(c.out, body...)
	}
	c.finish()
}

// finish ends the current exchange: the upstream connection goes back to
// the pool, and c waits for its next request.
func (c *loopConn) finish() {
	if u := c.detach(); u != nil {
		if u.reusable && len(u.In) == 0 && !c.l.e.closing.Load() {
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
	c.request.reset()
	if c.closeEnd || c.EOF {
		c.enter(stClosing)
		return
	}
	c.enter(stHead)
}

// cutOff ends an exchange whose response body cannot be relayed: the
// client's connection is closed mid-answer, as the general path does.
func (c *loopConn) cutOff() {
	c.flushNow() // what came before the break, as far as the socket takes it
	c.close()
}
