package evloop

import (
	"net"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sock is a non-blocking socket as a loop sees it: its edge-triggered
// readiness, remembered until a call returns EAGAIN, and what was read
// from it and not consumed yet.
type Sock struct {
	FD       int
	In       []byte // read, not consumed yet
	keep     []byte // the array In starts on, reused once In is consumed
	Readable bool
	Writable bool
	Hup      bool  // the peer closed or failed: read to the end
	EOF      bool  // the end of the stream (or a failure) was read
	Err      error // the loop could not change the socket's registration: its owner closes it
}

// KeepBuffer is the largest read buffer a socket keeps between reads.
const KeepBuffer = 16 << 10

// Note records the readiness an epoll event reports; writable again after
// a blocked write, the socket is no longer watched for writing.
func (s *Sock) Note(p *Poller, ev uint32) {
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.Readable = true
	}
	if ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.Hup = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 && !s.Writable {
		s.Writable = true
		if err := p.Watch(s.FD, unix.EPOLL_CTL_MOD, false); err != nil {
			s.Broke(err)
		}
	}
}

// Broke records that s's epoll registration could not be changed: s is
// then neither read nor written, and its owner closes it (a socket whose
// readiness the loop can no longer follow would stall to its deadline).
func (s *Sock) Broke(err error) {
	if s.Err == nil {
		s.Err = SyscallErr("epoll_ctl", err)
	}
	s.Readable, s.Writable, s.EOF = false, false, true
}

// Write writes b to the socket until all of it is written, a write would
// block (the socket is then watched for writing until it is writable
// again), or a write fails; it returns how much it wrote.
func (s *Sock) Write(p *Poller, b []byte) (int, error) {
	n := 0
	for n < len(b) && s.Writable {
		m, err := RawWrite(s.FD, b[n:])
		switch err {
		case nil:
			n += m
		case unix.EINTR:
		case unix.EAGAIN:
			s.Blocked(p)
			if s.Err != nil {
				return n, s.Err
			}
		default:
			return n, err
		}
	}
	return n, s.Err
}

// Blocked records a write that would block: the socket is watched for
// writing until it is writable again.
func (s *Sock) Blocked(p *Poller) {
	s.Writable = false
	if err := p.Watch(s.FD, unix.EPOLL_CTL_MOD, true); err != nil {
		s.Broke(err)
	}
}

// Fill reads what the peer sent into s.In, through buf; false when
// nothing was read (EAGAIN, the end of the stream, or an error: EOF).
func (s *Sock) Fill(buf []byte) bool {
	if !s.Readable || s.EOF {
		return false
	}
	n, err := RawRead(s.FD, buf)
	return s.Took(buf, n, err)
}

// ReadInto reads what the peer sent straight into p, past s.In (which the
// caller has emptied): a relay that moves the bytes on at once saves their
// copy. It returns how many bytes came, and false as Fill does.
func (s *Sock) ReadInto(p []byte) (int, bool) {
	if !s.Readable || s.EOF {
		return 0, false
	}
	n, err := RawRead(s.FD, p)
	if !s.read(len(p), n, err) || err != nil {
		return 0, err == unix.EINTR
	}
	return n, true
}

// read follows a read of up to size bytes that gave n, or err: EAGAIN and
// a short read drain the socket; the end of the stream or an error is
// EOF. It reports whether the socket may have more (true for EINTR).
func (s *Sock) read(size, n int, err error) bool {
	switch {
	case err == unix.EINTR:
		return true
	case err == unix.EAGAIN:
		s.Readable = false
		return false
	case err != nil || n == 0:
		s.EOF = true
		s.Readable = false
		return false
	}
	if n < size && !s.Hup {
		s.Readable = false // drained: the next byte is a new edge (the end of the stream is not)
	}
	return true
}

// Took records a read into buf that gave n bytes, or err: the bytes go to
// s.In, and the readiness follows (a short read drained the socket). It
// reports what Fill reports.
func (s *Sock) Took(buf []byte, n int, err error) bool {
	if !s.read(len(buf), n, err) || err != nil {
		return err == unix.EINTR
	}
	if len(s.In) == 0 {
		if cap(s.keep) > KeepBuffer {
			s.keep = nil // one large read does not pin its buffer
		}
		s.In = append(s.keep[:0], buf[:n]...)
		s.keep = s.In
	} else {
		s.In = append(s.In, buf[:n]...)
	}
	return true
}

// Consumed lets go of a large read buffer once In has been consumed (a
// relay moved it on), so that a socket whose reading waits (its data's
// client does not read) does not pin the buffer meanwhile.
func (s *Sock) Consumed() {
	if len(s.In) == 0 && cap(s.keep) > KeepBuffer {
		s.In, s.keep = nil, nil
	}
}

// RawRead and RawWrite are read(2) and write(2) on a non-blocking socket,
// without telling the Go scheduler: they never block.
func RawRead(fd int, p []byte) (int, error) {
	n, _, errno := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// RawWrite: see RawRead.
func RawWrite(fd int, p []byte) (int, error) {
	n, _, errno := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// SyscallErr wraps a failed socket call as the net package would.
func SyscallErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return &net.OpError{Op: op, Net: "tcp", Err: os.NewSyscallError(op, err)}
}
