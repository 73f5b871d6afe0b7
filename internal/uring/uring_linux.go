//go:build linux

package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring ABI (include/uapi/linux/io_uring.h).
const (
	opSend = 26 // IORING_OP_SEND
	opRecv = 27 // IORING_OP_RECV

	setupSingleIssuer = 1 << 12 // IORING_SETUP_SINGLE_ISSUER (Linux 6.0)
	setupDeferTaskrun = 1 << 13 // IORING_SETUP_DEFER_TASKRUN (Linux 6.1)

	enterGetEvents = 1 // IORING_ENTER_GETEVENTS

	offSQRing = 0          // IORING_OFF_SQ_RING
	offSQEs   = 0x10000000 // IORING_OFF_SQES

	featSingleMmap    = 1 << 0 // IORING_FEAT_SINGLE_MMAP
	featNativeWorkers = 1 << 9 // IORING_FEAT_NATIVE_WORKERS (Linux 5.12)

	registerProbe = 8 // IORING_REGISTER_PROBE
	opSupported   = 1 // IO_URING_OP_SUPPORTED
)

// probe is struct io_uring_probe with room for every operation.
type probe struct {
	lastOp uint8
	opsLen uint8
	_      uint16
	_      [3]uint32
	ops    [256]probeOp
}

type probeOp struct {
	op    uint8
	_     uint8
	flags uint16
	_     uint32
}

// params is struct io_uring_params.
type params struct {
	sqEntries    uint32
	cqEntries    uint32
	flags        uint32
	sqThreadCPU  uint32
	sqThreadIdle uint32
	features     uint32
	wqFD         uint32
	resv         [3]uint32
	sqOff        sqringOffsets
	cqOff        cqringOffsets
}

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

// sqe is struct io_uring_sqe, 64 bytes, with the fields recv and send use.
type sqe struct {
	opcode   uint8
	flags    uint8
	ioprio   uint16
	fd       int32
	off      uint64
	addr     uint64
	len      uint32
	msgFlags uint32
	userData uint64
	bufIndex uint16
	pers     uint16
	fileIdx  int32
	addr3    uint64
	_        uint64
}

// cqe is struct io_uring_cqe.
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// Ring is one io_uring. It is not safe for concurrent use (see the
// package's doc).
type Ring struct {
	fd      int
	rings   []byte // the submission and completion rings (one mapping, or the first of two)
	cqRings []byte // the completion ring's own mapping, where the kernel gives two
	sqeMem  []byte

	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        []uint32
	sqes           []sqe
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []cqe

	queued int      // operations queued since the last Submit
	held   [][]byte // their buffers: kept alive (and on the heap) until Submit returns
}

// New sets up a ring for up to entries operations between two Submits
// (rounded up to a power of two by the kernel). It fails where the kernel
// has no io_uring or refuses it (io_uring_disabled, a seccomp filter):
// the caller then makes its system calls one by one.
func New(entries uint32) (*Ring, error) {
	p := params{flags: setupSingleIssuer | setupDeferTaskrun}
	fd, err := setup(entries, &p)
	if err == unix.EINVAL { // a kernel older than 6.1
		p = params{}
		fd, err = setup(entries, &p)
	}
	if err != nil {
		return nil, err
	}
	r := &Ring{fd: fd}
	if err := r.check(&p); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.mapRings(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// check refuses a kernel whose io_uring lacks what the package relies on:
// recv and send (Linux 5.6), and MSG_DONTWAIT answering EAGAIN instead of
// waiting for the socket, which kernels before 5.12 (the first with
// IORING_FEAT_NATIVE_WORKERS) are not relied on for.
func (r *Ring) check(p *params) error {
	if p.features&featNativeWorkers == 0 {
		return errors.New("uring: the kernel's io_uring is older than Linux 5.12")
	}
	var pr probe
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerProbe, uintptr(unsafe.Pointer(&pr)), uintptr(len(pr.ops)), 0, 0)
	if errno != 0 {
		return errno
	}
	for _, op := range []uint8{opSend, opRecv} {
		if op > pr.lastOp || pr.ops[op].flags&opSupported == 0 {
			return fmt.Errorf("uring: the kernel's io_uring has no operation %d", op)
		}
	}
	return nil
}

func setup(entries uint32, p *params) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

func (r *Ring) mapRings(p *params) error {
	if p.cqEntries < p.sqEntries {
		return errors.New("uring: completion ring smaller than the submission ring")
	}
	sqSize := int(p.sqOff.array) + int(p.sqEntries)*4
	cqSize := int(p.cqOff.cqes) + int(p.cqEntries)*int(unsafe.Sizeof(cqe{}))
	size := sqSize
	if p.features&featSingleMmap != 0 {
		size = max(sqSize, cqSize)
	}
	var err error
	if r.rings, err = mmap(r.fd, offSQRing, size); err != nil {
		return err
	}
	cqBase := unsafe.Pointer(&r.rings[0])
	if p.features&featSingleMmap == 0 {
		const offCQRing = 0x8000000 // IORING_OFF_CQ_RING
		if r.cqRings, err = mmap(r.fd, offCQRing, cqSize); err != nil {
			return err
		}
		cqBase = unsafe.Pointer(&r.cqRings[0])
	}
	if r.sqeMem, err = mmap(r.fd, offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(sqe{}))); err != nil {
		return err
	}
	sq := unsafe.Pointer(&r.rings[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.sqOff.head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.sqOff.tail))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.sqOff.ringMask))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Add(sq, p.sqOff.array)), p.sqEntries)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	r.cqHead = (*uint32)(unsafe.Add(cqBase, p.cqOff.head))
	r.cqTail = (*uint32)(unsafe.Add(cqBase, p.cqOff.tail))
	r.cqMask = *(*uint32)(unsafe.Add(cqBase, p.cqOff.ringMask))
	r.cqes = unsafe.Slice((*cqe)(unsafe.Add(cqBase, p.cqOff.cqes)), p.cqEntries)
	return nil
}

func mmap(fd int, off int64, size int) ([]byte, error) {
	return unix.Mmap(fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
}

// Close releases the ring. Operations queued and not submitted are dropped.
func (r *Ring) Close() error {
	for _, m := range [][]byte{r.sqeMem, r.cqRings, r.rings} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqRings, r.rings = nil, nil, nil
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// Space is how many more operations can be queued before Submit.
func (r *Ring) Space() int { return len(r.sqes) - r.queued }

// Recv queues a recv(2) of up to len(p) bytes from socket fd into p, with
// MSG_DONTWAIT; tag comes back with its result. It reports false, queuing
// nothing, when the ring is full (see Space) or p is empty.
func (r *Ring) Recv(fd int, p []byte, tag uint64) bool {
	return r.queue(opRecv, fd, p, unix.MSG_DONTWAIT, tag)
}

// Send queues a send(2) of p on socket fd, with MSG_DONTWAIT and
// MSG_NOSIGNAL (a peer gone answers EPIPE, not SIGPIPE); tag comes back
// with its result. It reports false, queuing nothing, when the ring is
// full or p is empty.
func (r *Ring) Send(fd int, p []byte, tag uint64) bool {
	return r.queue(opSend, fd, p, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, tag)
}

func (r *Ring) queue(op uint8, fd int, p []byte, flags uint32, tag uint64) bool {
	if len(p) == 0 || r.queued >= len(r.sqes) {
		return false
	}
	tail := *r.sqTail // only this thread writes the tail
	i := tail & r.sqMask
	r.sqes[i] = sqe{opcode: op, fd: int32(fd), addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))),
		len: uint32(len(p)), msgFlags: flags, userData: tag}
	r.sqArray[i] = i
	atomic.StoreUint32(r.sqTail, tail+1) // the kernel reads the entry after it sees the tail move
	r.queued++
	r.held = append(r.held, p)
	return true
}

// RawEnterMax is the most operations a Submit makes in a raw system call
// (see Submit): enough for a pass of two loops at 50 connections, where
// the raw call was measured to save CPU, few enough that a garbage
// collection's pause waits for little (docs/performance.md, "Raw system
// calls…").
const RawEnterMax = 64

// Submit makes every queued operation in one io_uring_enter, waits for
// all their results (which, with MSG_DONTWAIT, the kernel gives at once)
// and calls done with each one's tag and result: a byte count, or a
// negated errno (-EAGAIN when the socket had nothing to give or no room).
// An error means the ring failed (the operations whose results were not
// given were not made): the caller closes it and goes on without.
//
// A Submit of up to RawEnterMax operations makes io_uring_enter as a raw
// system call, one the Go scheduler is not told of: it never blocks
// (every operation carries MSG_DONTWAIT), so the runtime has no reason to
// take the thread's processor meanwhile. It would when the kernel's work
// for the sends (on loopback, the receivers' side too) outlasts its 20 µs
// check while no processor is idle, and a ring's thread is locked (see
// the package's doc): back from the call, it may have to wait for a
// processor to come back. The price: the runtime cannot stop the world
// while a raw call runs, so a garbage collection's pauses wait for it. A
// larger Submit (a loop's pass at many connections) is made as a call the
// scheduler knows of, so that no pause waits for more than RawEnterMax
// operations' work in the kernel.
func (r *Ring) Submit(done func(tag uint64, res int32)) error {
	defer func() {
		clear(r.held)
		r.held = r.held[:0]
	}()
	enter := unix.RawSyscall6
	if r.queued > RawEnterMax {
		enter = unix.Syscall6
	}
	n := r.queued // results due
	for n > 0 {
		got, _, errno := enter(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.queued), uintptr(n), enterGetEvents, 0, 0)
		switch errno {
		case 0:
			r.queued -= int(got)
		case unix.EINTR, unix.EAGAIN, unix.EBUSY: // interrupted, or completions to reap first
		default:
			n -= r.reap(done)
			return errno
		}
		n -= r.reap(done)
	}
	return nil
}

// reap gives the completions posted so far to done and returns how many.
func (r *Ring) reap(done func(tag uint64, res int32)) int {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail) // the entries before it are written
	n := 0
	for ; head != tail; head++ {
		c := r.cqes[head&r.cqMask]
		done(c.userData, c.res)
		n++
	}
	atomic.StoreUint32(r.cqHead, head) // their slots are the kernel's again
	return n
}
