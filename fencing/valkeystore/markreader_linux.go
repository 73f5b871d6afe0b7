package valkeystore

import (
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/fencing"
)

const markReadersSupported = true

// markReader is a fencing.MarkReader on a non-blocking socket.
type markReader struct {
	s      *Store
	fd     int
	out    []byte // reads not written yet
	buf    []byte // one read
	r      markReplies
	sentAt time.Time
	busy   bool // a batch is out
	closed bool
}

// newMarkReader takes a duplicate of conn's socket, in non-blocking mode.
func newMarkReader(s *Store, conn *net.TCPConn) (fencing.MarkReader, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, dupErr := -1, error(nil)
	if err := raw.Control(func(f uintptr) { fd, dupErr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, fmt.Errorf("mark reader: %w", dupErr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mark reader: %w", err)
	}
	return &markReader{s: s, fd: fd, buf: make([]byte, 16<<10), r: markReplies{s: s}}, nil
}

func (m *markReader) Fd() int { return m.fd }

// Send implements fencing.MarkReader. A store that is closed, or whose
// server evicts keys, fails it (and Admit refuses as well).
func (m *markReader) Send(now time.Time, reqs []fencing.AdmitRequest) (bool, error) {
	if m.busy {
		return false, errors.New("valkeystore: mark reader: a batch is still out")
	}
	if err := m.s.checkOpen("admit"); err != nil {
		return false, err
	}
	if err := m.s.checkPolicy("admit"); err != nil {
		return false, err
	}
	m.out = m.r.start(m.out[:0], reqs)
	m.busy, m.sentAt = true, now
	if m.r.sent == 0 {
		return false, nil // nothing to read: Receive answers at once
	}
	return m.Flush()
}

// Flush implements fencing.MarkReader.
func (m *markReader) Flush() (bool, error) {
	for len(m.out) > 0 {
		n, err := unix.Write(m.fd, m.out)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return true, nil
		case err != nil:
			return false, fmt.Errorf("%w: mark reader: %w", fencing.ErrUnavailable, err)
		}
		m.out = m.out[:copy(m.out, m.out[n:])]
	}
	return false, nil
}

// Awaiting implements fencing.MarkReader.
func (m *markReader) Awaiting() bool { return m.busy && m.r.got < m.r.sent }

// Receive implements fencing.MarkReader.
func (m *markReader) Receive(out []fencing.Admission, settled []bool) (bool, error) {
	if !m.busy {
		return false, errors.New("valkeystore: mark reader: no batch is out")
	}
	done := m.r.got == m.r.sent
	for !done {
		n, err := unix.Read(m.fd, m.buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false, nil
		case err != nil:
			return false, fmt.Errorf("%w: mark reader: %w", fencing.ErrUnavailable, err)
		case n == 0:
			return false, fmt.Errorf("%w: mark reader: the server closed the connection", fencing.ErrUnavailable)
		}
		if done, err = m.r.add(m.buf[:n]); err != nil {
			return false, err
		}
	}
	copy(out, m.r.out)
	copy(settled, m.r.ok)
	m.busy = false
	return true, nil
}

// Overdue implements fencing.MarkReader.
func (m *markReader) Overdue(now time.Time) bool {
	return m.busy && now.Sub(m.sentAt) > m.s.cmdTimeout
}

// Close implements fencing.MarkReader.
func (m *markReader) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	return unix.Close(m.fd)
}
