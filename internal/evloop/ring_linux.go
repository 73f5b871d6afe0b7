package evloop

import (
	"golang.org/x/sys/unix"

	"github.com/fencegate/fencegate/internal/uring"
)

// ReadAhead is a pass's reads made ahead of a loop's state machine: the
// sockets added are read in one system call through an io_uring, each
// into a buffer of its own, and each result is taken as Fill takes a
// read(2)'s (Took): what the state machine then wants is in s.In. It is
// the loop's, reused from pass to pass.
type ReadAhead struct {
	socks []*Sock
	buf   []byte // size bytes per socket
	size  int
}

// NewReadAhead returns a batch of at most n reads of size bytes each.
func NewReadAhead(n, size int) *ReadAhead {
	return &ReadAhead{socks: make([]*Sock, 0, n), size: size}
}

// Add queues a read of s; false when the batch is full.
func (r *ReadAhead) Add(s *Sock) bool {
	if len(r.socks) == cap(r.socks) {
		return false
	}
	r.socks = append(r.socks, s)
	return true
}

// Submit makes the queued reads through ring and takes their results; the
// batch is empty after it. A ring that fails leaves the reads whose
// results it did not give unmade (their sockets stay readable): the
// caller drops the ring and reads one by one.
func (r *ReadAhead) Submit(ring *uring.Ring) error {
	if len(r.socks) == 0 {
		return nil
	}
	if r.buf == nil {
		r.buf = make([]byte, cap(r.socks)*r.size)
	}
	for i, s := range r.socks {
		ring.Recv(s.FD, r.read(i), uint64(i))
	}
	err := ring.Submit(r.took)
	clear(r.socks)
	r.socks = r.socks[:0]
	return err
}

func (r *ReadAhead) read(i int) []byte { return r.buf[i*r.size : (i+1)*r.size] }

func (r *ReadAhead) took(tag uint64, res int32) {
	n, err := RingResult(res)
	r.socks[tag].Took(r.read(int(tag)), n, err)
}

// RingResult is a ring's result as a system call's.
func RingResult(res int32) (int, error) {
	if res < 0 {
		return 0, unix.Errno(-res)
	}
	return int(res), nil
}

// Wrote takes the result of a send made through a ring to s, as Write
// takes write(2)'s: the count written, 0 and nil when it would block (s
// is then watched for writing; should that fail, s.Err says so) or was
// interrupted, or the write's error.
func (s *Sock) Wrote(p *Poller, res int32) (int, error) {
	n, err := RingResult(res)
	switch err {
	case nil:
		return n, nil
	case unix.EINTR:
		return 0, nil
	case unix.EAGAIN:
		s.Blocked(p)
		return 0, nil
	}
	return 0, err
}
