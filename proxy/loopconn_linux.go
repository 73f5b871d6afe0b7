//go:build linux

package proxy

import (
	"crypto/tls"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/evloop"
	"github.com/fencegate/fencegate/internal/h1"
)

// connState is where a loop connection's current request is. The
// phases live one file each: reading and deciding (loopread_linux.go), the
// upstream exchange (loopupstream_linux.go), relaying the answer
// (looprelay_linux.go). A connection changes state only through enter,
// which sets the state's deadline; expire says what a passed deadline
// does.
//
//	state       entered by                  deadline (expire)
//	stHead      add, finish, readHead       header timeout on a new connection or once a request's
//	                                        first byte is in, idle timeout between requests (408, or close when idle)
//	stBody      parseHead                   body timeout (408 through the gate's answer)
//	stAdmit     start                       none: the store's and the barrier's timeouts bound it
//	stUpstream  forward, upstreamBroke      upstream timeout from forward; a retry keeps it (504/502)
//	stSend      upConn.attach               kept
//	stResponse  send                        kept
//	stRelay     answered                    kept: it bounds the whole exchange with the upstream (close)
//	stClosing   finish, expire              header timeout, to write the last answer (close)
type connState int

const (
	stHead     connState = iota // reading a request's head (or idle between requests)
	stBody                      // reading its Content-Length body
	stAdmit                     // deciding and admitting (in the loop, a batch or a goroutine)
	stUpstream                  // waiting for an upstream connection
	stSend                      // sending the request upstream
	stResponse                  // reading the upstream's response head
	stRelay                     // relaying the response body
	stClosing                   // writing the last answer, then closing
)

// enter moves c to state st and sets st's deadline (see connState): the
// one place that does either.
func (c *loopConn) enter(st connState) {
	s, g, now := c.l.e.s, c.l.e.g, c.l.now
	prev := c.state
	c.state = st
	switch st {
	case stHead:
		if c.served == 0 || len(c.In) > 0 {
			c.deadline = now.Add(s.headerTimeout)
		} else {
			c.deadline = now.Add(s.idleTimeout)
		}
	case stBody:
		c.deadline = now.Add(g.bodyTimeout)
	case stAdmit:
		c.deadline = time.Time{}
	case stUpstream:
		if prev != stSend && prev != stResponse { // a retry keeps the first attempt's
			c.deadline = now.Add(g.upstreamTO)
		}
	case stSend, stResponse, stRelay:
		// The upstream timeout, set on entering stUpstream, goes on.
	case stClosing:
		c.deadline = now.Add(s.headerTimeout)
	}
}

// loopConn is a client connection served by an event loop.
type loopConn struct {
	evloop.Sock
	l        *eventLoop
	remote   *net.TCPAddr
	client   netip.Addr           // its key under the per-client cap (connlimit.Client)
	tls      *tls.ConnectionState // a connection whose TLS a relay terminates (looptls_linux.go); nil: cleartext
	state    connState
	deadline time.Time // of the current step; zero: none
	closed   bool
	fdClosed bool // its descriptor is closed
	touched  bool // in its loop's touched list (loopguard_linux.go)

	out    []byte // to write to the client
	served int    // requests answered on this connection

	request  loopRequest // the current request, reused
	x        *exchange
	t        flight // the write's place at the barrier, or nil
	bodyLen  int
	closeEnd bool // close once the current answer is written
	// admitting: the write's admission went to a goroutine, a batch or
	// the end of the pass, which calls admitted and ends it there.
	admitting bool

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
	c.Note(c.l.p, ev)
	c.run()
}

// run moves c's request on as far as its sockets allow.
func (c *loopConn) run() {
	c.l.touch(c)
	for !c.closed {
		if c.Err != nil || c.up != nil && c.up.Err != nil {
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
	if c.Err != nil {
		c.close()
		return
	}
	switch c.state {
	case stSend, stResponse:
		c.upstreamBroke(c.up.Err)
	default:
		c.cutOff()
	}
}

// flush writes c.out, or queues it for the end of the pass (see
// writeLater); false while some is left (or c failed).
func (c *loopConn) flush() bool {
	if len(c.out) > 0 && c.l.writeLater(c, &c.Sock) {
		return false
	}
	return c.flushNow()
}

// flushNow writes c.out at once, as far as the socket takes it.
func (c *loopConn) flushNow() bool {
	n, err := c.Sock.Write(c.l.p, c.out)
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
	c.dropLargeOut()
	return true
}

// dropLargeOut lets go of an empty output buffer larger than
// evloop.KeepBuffer once no answer is being relayed, so a large answer
// does not pin its buffer on an idle connection (a relay keeps its window
// from one write to the next).
func (c *loopConn) dropLargeOut() {
	if len(c.out) == 0 && cap(c.out) > evloop.KeepBuffer && c.state != stRelay {
		c.out = nil
	}
}

// expire fires c's deadline.
func (c *loopConn) expire() {
	c.l.touch(c)
	switch c.state {
	case stHead:
		if len(c.In) == 0 {
			c.close() // idle, or nothing sent in time
			return
		}
		c.out = append(c.out, headTimeoutProblem().Response()...)
		c.enter(stClosing)
	case stBody:
		c.start(os.ErrDeadlineExceeded)
	case stUpstream:
		if c.dialing {
			c.dialing = false // the dial's result is dropped
			c.upstreamFailed(errDialTimeout)
		} else {
			c.l.pool.unqueue(c)
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
	c.fdClosed = true
	unix.Close(c.FD)
	c.releaseSlot()
	if u := c.detach(); u != nil {
		u.close()
	}
	c.dialing = false
	if c.x != nil && !c.admitting { // an admission ends it itself
		if c.t != nil {
			c.t.Hold(c.l.e.g.grace) // the write may be in the upstream
			c.t = nil
			c.l.e.g.count(c.x, CodeClientGone)
		}
		c.l.e.g.end(c.x)
		c.x = nil
	}
}

// releaseSlot gives back c's place under the connection cap, when c holds
// it: a connection whose TLS a relay terminates holds none (its relay
// does, until the client's connection is closed).
func (c *loopConn) releaseSlot() {
	if c.tls == nil {
		c.l.e.s.limit.Release(c.client)
	}
}
