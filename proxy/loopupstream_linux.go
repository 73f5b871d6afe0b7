//go:build linux

package proxy

import (
	"net/http"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/evloop"
	"github.com/fencegate/fencegate/internal/h1"
)

// The upstream phase: a connection from the loop's pool (or a new one),
// the request sent, the response head read (h1); the failures before an
// answer and the one retry of a read on a pooled connection. The pooled
// connections (upConn) are the loop's, lent to one request at a time.

// forward prepares the request for the upstream and finds it a
// connection.
func (c *loopConn) forward(t flight) {
	g := c.l.e.g
	l := c.l
	c.t = t
	body := c.request.body
	c.req = append(g.appendUpstreamHead(c.req[:0], c.x, len(body)), body...)
	c.sent = 0
	c.retried = false
	c.enter(stUpstream)
	if g.beforeSend != nil {
		l.e.goTracked(workSendHook, func() {
			g.beforeSend()
			l.post(func() { // refused once the loop has stopped: closeAll closed c, holding its place
				if !c.closed && c.state == stUpstream {
					l.pool.get(c)
					c.run()
				}
			})
		})
		return
	}
	l.pool.get(c)
}

// send writes the request to the upstream connection, or queues it for
// the end of the pass (see writeLater).
func (c *loopConn) send() bool {
	if c.sent < len(c.req) && c.l.writeLater(c, &c.up.Sock) {
		return false
	}
	n, err := c.up.Write(c.l.p, c.req[c.sent:])
	c.sent += n
	switch {
	case err != nil:
		c.upstreamBroke(evloop.SyscallErr("write", err))
		return true
	case c.sent < len(c.req):
		return false
	}
	c.enter(stResponse)
	return true
}

// readResponse waits for the upstream's response head, then sends the
// client its own.
func (c *loopConn) readResponse() bool {
	u := c.up
	l := c.l
	for {
		end := h1.HeadEnd(u.In)
		if end < 0 {
			// A bare LF (or NUL) in the head: it would never end in CRLF
			// CRLF, and waiting for that would hold the client until the
			// upstream timeout. The loops do not read such an answer.
			if len(u.In) > upstreamReadBuffer || h1.BareLineEnd(u.In) {
				c.upstreamBroke(errUpstreamHead)
				return true
			}
			if !u.Fill(u.l.buf) {
				if u.EOF {
					c.upstreamBroke(errUpstreamClosed)
					return true
				}
				return false
			}
			continue
		}
		// The head's fields alias u.In until answered has copied them
		// to c.out, before u reads again. A head larger than the bound
		// that arrived in one read is refused as one read in pieces is
		// (and as the general engine refuses it).
		if end > upstreamReadBuffer {
			c.upstreamBroke(errUpstreamHead)
			return true
		}
		if err := h1.ParseResponse(u.In[:end], &l.resp); err != nil {
			c.upstreamBroke(errUpstreamHead)
			return true
		}
		u.In = u.In[end:]
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
	if u != nil && u.reused && !c.retried && len(u.In) == 0 && safeMethod(c.x.method) && err != errUpstreamHead {
		c.detach().close()
		c.retried = true
		c.sent = 0
		c.enter(stUpstream)
		c.l.pool.dialNew(c)
		return
	}
	c.upstreamFailed(err)
}

// upConn is a connection to the upstream, owned by a loop: attached to one
// client connection while a request uses it, idle in the pool otherwise.
type upConn struct {
	evloop.Sock
	l         *eventLoop
	client    *loopConn
	reused    bool // it served a request before
	reusable  bool // it may serve another after this one
	idleSince time.Time
	closed    bool
}

func (u *upConn) ready(ev uint32) {
	u.Note(u.l.p, ev)
	if c := u.client; c != nil {
		c.run()
		return
	}
	if u.Err != nil {
		u.close()
		return
	}
	// Idle: anything from the upstream now (its close, or bytes no
	// request asked for, maybe read ahead) ends the connection.
	if len(u.In) > 0 || u.EOF || u.Readable && (u.Fill(u.l.buf) || u.EOF) {
		u.close()
	}
}

// closedByPeer reports whether the upstream has closed u, idle since
// idleSince, or sent on it what no request asked for, as far as the loop
// can tell at now, as a request takes it. The loop learns of a close from
// the events of its last wait; a close that came since (an upstream's idle
// timeout fires at any moment) would take the request with it, and a
// write sent on a closed connection is answered 502 "may have been
// applied" with the barrier held, though the upstream never read it. So a
// connection idle for upstreamLook or longer gets one read of its socket
// here (nothing to read: live). One busier than that is taken on its
// events alone: under load no request pays the read, and upstreams close
// idle connections after seconds, not within a millisecond.
func (u *upConn) closedByPeer(now time.Time) bool {
	if len(u.In) > 0 || u.EOF || u.Hup || u.Err != nil { // read ahead this pass
		return true
	}
	if now.Sub(u.idleSince) < upstreamLook {
		return false
	}
	u.Readable = true
	u.Fill(u.l.buf)
	return len(u.In) > 0 || u.EOF
}

// attach gives u to c's request.
func (u *upConn) attach(c *loopConn) {
	u.client = c
	c.up = u
	c.enter(stSend)
}

// release returns u to its loop's pool, or to a request waiting for one.
func (u *upConn) release() {
	l := u.l
	u.reused = true
	u.In = u.In[:0]
	l.pool.put(u)
}

func (u *upConn) close() {
	if u.closed {
		return
	}
	u.closed = true
	l := u.l
	l.pool.drop(u)
	l.fds.del(u.FD)
	unix.Close(u.FD)
	l.e.upConns.Add(-1)
}
