//go:build linux

package proxy

import (
	"errors"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing"
)

// A loop's mark reader (see loopadmit_linux.go): opened by a goroutine the
// first time the loop has writes for it, then driven by the loop. A reader
// that fails or is overdue is closed, its batch goes to the worker, and a
// new one is opened after a pause that doubles with each failure in a row
// (markRetryMin to markRetryMax).

const (
	markRetryMin = time.Second
	markRetryMax = 30 * time.Second
)

// errMarksOverdue fails a mark reader whose answers are late.
var errMarksOverdue = errors.New("the store's mark reader did not answer within its command timeout")

// loopMarks is a loop's mark reader and its state between readers. Only
// the loop uses it, but for opened, openErr and closed, which the opening
// goroutine sets.
type loopMarks struct {
	conn     *markConn // open; nil otherwise
	opening  bool      // a goroutine is opening one
	none     bool      // the store has no mark readers in its setup
	retryAt  time.Time // no new reader before
	failures int       // in a row

	mu      sync.Mutex
	opened  fencing.MarkReader
	openErr error
	closed  bool // the loop has stopped: a reader opened now is closed
}

// active reports whether the loop has a mark reader open: then the writes
// for it wait for it. Without one, it starts opening one when its time has
// come; meanwhile the worker admits every write.
func (lm *loopMarks) active(l *eventLoop) bool {
	if l.e.g.marks == nil || lm.none {
		return false
	}
	if lm.conn == nil && !lm.opening && !l.now.Before(lm.retryAt) {
		lm.open(l)
	}
	return lm.conn != nil
}

// free returns the open mark reader when no batch is out on it.
func (lm *loopMarks) free() *markConn {
	if lm.conn == nil || len(lm.conn.batch) > 0 {
		return nil
	}
	return lm.conn
}

// open opens a reader on a goroutine and hands it to the loop.
func (lm *loopMarks) open(l *eventLoop) {
	lm.opening = true
	stores := l.e.g.marks
	l.e.goTracked(workMarks, func() {
		r, err := l.openMarkReader(stores) // bounded by the store's dial and command timeouts, and by stop
		lm.mu.Lock()
		if lm.closed {
			lm.mu.Unlock()
			if r != nil {
				_ = r.Close()
			}
			return
		}
		lm.opened, lm.openErr = r, err
		lm.mu.Unlock()
		l.post(func() { lm.attach(l) }) // refused once the loop has stopped: close closes what it left
	})
}

// attach takes the reader the opening goroutine left, if any.
func (lm *loopMarks) attach(l *eventLoop) {
	lm.mu.Lock()
	r, err := lm.opened, lm.openErr
	lm.opened, lm.openErr = nil, nil
	lm.mu.Unlock()
	lm.opening = false
	switch {
	case err != nil:
		lm.failed(l, err)
		return
	case r == nil:
		lm.none = true
		return
	}
	fd := r.Fd()
	if err := l.watch(fd, unix.EPOLL_CTL_ADD, false); err != nil {
		_ = r.Close()
		lm.failed(l, err)
		return
	}
	lm.conn = &markConn{l: l, r: r}
	l.fds.set(fd, lm.conn)
}

// failed schedules the next reader after a failure.
func (lm *loopMarks) failed(l *eventLoop, err error) {
	lm.failures++
	pause := min(markRetryMin<<min(lm.failures-1, 5), markRetryMax)
	lm.retryAt = l.now.Add(pause)
	log := l.e.g.log.Debug
	if lm.failures == 1 {
		log = l.e.g.log.Warn
	}
	log("gate: the store's mark reader failed; writes are admitted through the store's client until a new one opens",
		"error", err, "retry_in", pause)
}

// checkOverdue fails a reader whose answers are late (the loop's sweep).
func (lm *loopMarks) checkOverdue(l *eventLoop) {
	if m := lm.conn; m != nil && m.r.Overdue(l.now) {
		m.fail(errMarksOverdue)
		l.sendAdmits()
	}
}

// close closes the reader once the loop has stopped, and any a goroutine
// opens later. The writes of a batch still out leave the barrier.
func (lm *loopMarks) close() {
	lm.mu.Lock()
	lm.closed = true
	r := lm.opened
	lm.opened = nil
	lm.mu.Unlock()
	if r != nil {
		_ = r.Close()
	}
	if m := lm.conn; m != nil {
		for _, p := range m.batch {
			p.t.Leave()
		}
		_ = m.r.Close()
		lm.conn = nil
	}
}

// markConn is a loop's open mark reader, a socket of the loop like its
// clients' (edge-triggered, watched for writing only while a batch's reads
// are not all written).
type markConn struct {
	l        *eventLoop
	r        fencing.MarkReader
	batch    []pendingAdmit // the writes whose reads are out
	reqs     []fencing.AdmitRequest
	res      []fencing.Admission
	settled  []bool
	writable bool // waiting for the socket to take the rest of a batch
}

// send registers the batch's writes at the barrier, before their reads as
// admitWrite registers before admitting, and sends the reads.
func (m *markConn) send() {
	if len(m.batch) == 0 {
		return
	}
	g := m.l.e.g
	m.reqs = m.reqs[:0]
	for i := range m.batch {
		p := &m.batch[i]
		tg := p.d.Targets[0]
		p.t = g.barrier.Register(tg.Resource, tg.Token)
		m.reqs = append(m.reqs, fencing.AdmitRequest{Resource: tg.Resource, Token: p.d.Token})
	}
	n := len(m.reqs)
	m.res = slices.Grow(m.res[:0], n)[:n]
	m.settled = slices.Grow(m.settled[:0], n)[:n]
	pending, err := m.r.Send(m.l.now, m.reqs)
	if err != nil {
		m.fail(err)
		return
	}
	m.watchWritable(pending)
	if !m.r.Awaiting() {
		m.receive() // a batch with nothing to read is answered at once
	} // otherwise the answers come with the socket's readability
}

// watchWritable asks the poller for writability while bytes are pending.
func (m *markConn) watchWritable(pending bool) {
	if pending == m.writable {
		return
	}
	m.writable = pending
	if err := m.l.watch(m.r.Fd(), unix.EPOLL_CTL_MOD, pending); err != nil {
		m.fail(err)
	}
}

func (m *markConn) ready(events uint32) {
	if events&unix.EPOLLOUT != 0 && m.writable {
		pending, err := m.r.Flush()
		if err != nil {
			m.fail(err)
			return
		}
		m.watchWritable(pending)
	}
	if events&^unix.EPOLLOUT == 0 || m.l.marks.conn != m {
		return
	}
	if len(m.batch) == 0 {
		m.fail(errors.New("the store's connection closed or spoke between batches"))
		return
	}
	m.receive()
}

// receive reads the answers that have come, and settles the batch once all
// are in.
func (m *markConn) receive() {
	if m.l.marks.conn != m {
		return // failed
	}
	done, err := m.r.Receive(m.res, m.settled)
	if err != nil {
		m.fail(err)
		return
	}
	if !done {
		return
	}
	l, g := m.l, m.l.e.g
	l.marks.failures = 0
	for i, p := range m.batch {
		if !m.settled[i] {
			p.read = true // a raise or a refusal: the store admits it without reading again
			l.unread(p)
			continue
		}
		l.step(func() { // a panic in one write's step leaves the others theirs
			p.x.audit.admitted(m.res[i])
			if g.passNow(p.t) {
				p.c.admitted(p.t, true)
			} else {
				l.awaitTurn(p)
			}
		})
	}
	m.batch = m.batch[:0]
}

// unread gives write p, which its mark reader did not settle, to the
// worker: it leaves its place in the barrier, where the worker registers it
// again before admitting it.
func (l *eventLoop) unread(p pendingAdmit) {
	p.t.Leave()
	p.t = nil
	l.admission.admits = append(l.admission.admits, p)
}

// fail closes the reader and gives its batch to the worker.
func (m *markConn) fail(err error) {
	l := m.l
	if l.marks.conn != m {
		return
	}
	for _, p := range m.batch {
		l.unread(p)
	}
	m.batch = nil
	fd := m.r.Fd()
	_ = l.p.Remove(fd) // closing fd below removes it from the set anyway
	l.fds.del(fd)
	_ = m.r.Close()
	l.marks.conn = nil
	l.marks.failed(l, err)
}
