//go:build linux

package proxy

import (
	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/evloop"
	"github.com/fencegate/fencegate/internal/uring"
)

// A loop makes its socket reads and writes in batches where the kernel
// gives it an io_uring (internal/uring): the reads of the sockets an
// epoll_wait reported readable in one system call at the start of the
// pass (readAhead), the writes the pass produced in one at its end
// (writeLater, writeQueued). Each is the read(2) or write(2) the loop
// would have made, made a little earlier or later within the same pass,
// with the same results: the state machine of loopconn_linux.go does not
// know the difference. Where io_uring is missing or refused, or once the
// ring fails, the loop makes them one by one.

// loopBatchIO is what a loop keeps for its batched reads and writes.
type loopBatchIO struct {
	ring    *uring.Ring       // the pass's reads and writes in a system call each; nil: one by one
	ahead   *evloop.ReadAhead // the sockets read ahead this pass (see readAhead)
	writes  []*loopConn       // connections whose next write waits for the end of the pass
	spare   []*loopConn       // writes' other array, reused
	sending []pendingWrite    // the writes out in the ring, by tag
}

// openRing gives l its ring, on l's own (locked) thread, as a ring must
// be; without one l goes on with one system call per read and write.
func (l *eventLoop) openRing() {
	r, err := uring.New(loopRingEntries)
	if err != nil {
		l.e.g.log.Info("gate event loop: no io_uring here, one system call per read and write", "error", err)
		return
	}
	l.batchIO.ring = r
}

// ringFailed drops a ring that failed: the reads and writes whose results
// it did not give were not made, and are made one by one from now on.
func (l *eventLoop) ringFailed(err error) {
	l.e.g.log.Warn("gate event loop: io_uring failed, going on with one system call per read and write", "error", err)
	_ = l.batchIO.ring.Close()
	l.batchIO.ring = nil
}

// readAhead reads, in one system call, from every client and upstream
// socket of events that is readable and holds nothing unread, as fill
// would (sock.took): what the state machine then wants is in s.In. A
// socket whose unread bytes wait (say a pipelined request behind one
// being admitted) is not read ahead, so a socket keeps at most one read
// ahead of what its connection asks for. The events' read bits are noted
// here, and taken out of events.
func (l *eventLoop) readAhead(events []unix.EpollEvent) {
	if l.batchIO.ring == nil {
		return
	}
	const readBits = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR
	if l.batchIO.ahead == nil {
		l.batchIO.ahead = evloop.NewReadAhead(loopEvents, loopAheadRead)
	}
	for i := range events {
		ev := events[i].Events & readBits
		if ev == 0 {
			continue
		}
		var s *evloop.Sock
		switch o := l.fds.get(int(events[i].Fd)).(type) {
		case *loopConn:
			s = &o.Sock
		case *upConn:
			s = &o.Sock
		default:
			continue // the listener, the eventfd, a mark reader
		}
		s.Note(l.p, ev)
		events[i].Events &^= readBits
		if s.Readable && !s.EOF && len(s.In) == 0 {
			l.batchIO.ahead.Add(s) // at most loopEvents: one per event
		}
	}
	if err := l.batchIO.ahead.Submit(l.batchIO.ring); err != nil {
		l.ringFailed(err)
	}
}

// writeLater queues c's next write, to socket s, for the end of the pass,
// where the pass's writes go out in one system call; it reports false when
// c must write now instead (no ring, or s is not writable: the write then
// finds that itself).
func (l *eventLoop) writeLater(c *loopConn, s *evloop.Sock) bool {
	if l.batchIO.ring == nil || !s.Writable {
		return false
	}
	if !c.queued {
		c.queued = true
		l.batchIO.writes = append(l.batchIO.writes, c)
	}
	return true
}

// pendingWrite is a write out in the ring: c's answer to its client, or
// (up) the rest of its request to its upstream connection.
type pendingWrite struct {
	c  *loopConn
	s  *evloop.Sock
	up bool
}

// pendingOutput is what c would write next: its answer first, as run
// writes it, then in stSend the rest of its request.
func (c *loopConn) pendingOutput() (s *evloop.Sock, p []byte, up bool) {
	if len(c.out) > 0 {
		return &c.Sock, c.out, false
	}
	if c.state == stSend && c.up != nil {
		return &c.up.Sock, c.req[c.sent:], true
	}
	return nil, nil, false
}

// writeQueued makes the writes queued by writeLater, a ring's worth per
// system call, then moves each connection on (which may queue more: the
// loop calls it until none are left). A write's result is taken as
// flushNow and send take write(2)'s.
func (l *eventLoop) writeQueued() {
	batch := l.batchIO.writes
	l.batchIO.writes = l.batchIO.spare[:0]
	for next := 0; next < len(batch) && l.batchIO.ring != nil; {
		l.batchIO.sending = l.batchIO.sending[:0]
		for ; next < len(batch) && l.batchIO.ring.Space() > 0; next++ {
			c := batch[next]
			if !l.owns(c) {
				continue
			}
			s, p, up := c.pendingOutput()
			if s == nil || !s.Writable || len(p) == 0 {
				continue
			}
			l.batchIO.ring.Send(s.FD, p, uint64(len(l.batchIO.sending)))
			l.batchIO.sending = append(l.batchIO.sending, pendingWrite{c: c, s: s, up: up})
		}
		if err := l.batchIO.ring.Submit(l.wroteOne); err != nil {
			l.ringFailed(err)
		}
		clear(l.batchIO.sending)
	}
	for _, c := range batch {
		c.queued = false // all first: moving one on may move another
	}
	for i, c := range batch {
		if l.owns(c) {
			l.step(c.run)
		}
		batch[i] = nil
	}
	l.batchIO.spare = batch[:0]
}

// owns reports whether c is still l's to move on: not closed, nor handed
// to the fallback server.
func (l *eventLoop) owns(c *loopConn) bool {
	return !c.closed && l.fds.get(c.FD) == fdOwner(c)
}

// wroteOne takes the result of a write out in the ring.
func (l *eventLoop) wroteOne(tag uint64, res int32) {
	w := l.batchIO.sending[tag]
	c, s := w.c, w.s
	n, err := s.Wrote(l.p, res) // would block: s.Err, if it cannot be watched, and c.run ends it
	if err != nil {
		if w.up {
			c.upstreamBroke(evloop.SyscallErr("write", err))
		} else {
			c.close() // the client is gone
		}
		return
	}
	if w.up {
		c.sent += n
		return
	}
	c.out = c.out[:copy(c.out, c.out[n:])]
	c.dropLargeOut()
}
