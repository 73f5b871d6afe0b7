package evloop

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Poller is an epoll instance and an inbox: functions posted from any
// goroutine, run by the loop between its waits.
type Poller struct {
	ep     int
	wake   int         // an eventfd: Post writes it while the loop sleeps
	posted atomic.Bool // the eventfd was written and not read yet
	asleep atomic.Bool // the loop is in (or about to enter) a blocking wait
	queued atomic.Bool // the inbox may hold work
	mu     sync.Mutex
	inbox  []func()
	shut   bool // Shut ran: Post refuses
}

// New returns a poller with its eventfd watched.
func New() (*Poller, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return nil, err
	}
	p := &Poller{ep: ep, wake: wake}
	if err := p.Add(wake, unix.EPOLLIN); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// FD is the epoll instance's descriptor.
func (p *Poller) FD() int { return p.ep }

// Add watches fd (level-triggered unless events say otherwise), for a
// listener or an eventfd.
func (p *Poller) Add(fd int, events uint32) error {
	return unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
}

// Watch registers socket fd (op EPOLL_CTL_ADD), or changes its
// registration (EPOLL_CTL_MOD): edge-triggered, for reading always, for
// writing only when out says so. A socket is watched for writing only
// while a write to it is blocked: otherwise every acknowledgement from
// the peer would wake the loop.
func (p *Poller) Watch(fd, op int, out bool) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd)}
	if out {
		ev.Events |= unix.EPOLLOUT
	}
	return unix.EpollCtl(p.ep, op, fd, &ev)
}

// Remove stops watching fd.
func (p *Poller) Remove(fd int) error {
	return unix.EpollCtl(p.ep, unix.EPOLL_CTL_DEL, fd, nil)
}

// Post runs f on the loop. A loop that is awake finds f when its pass
// ends; only a sleeping one is woken (by the eventfd: a system call, and
// on a busy loop one per post). The loop marks itself asleep before it
// checks its inbox one last time, and Post queues before it checks that
// mark, so one of the two sees the other. After Shut, Post runs nothing
// and reports false: its caller cleans up what f would have.
func (p *Poller) Post(f func()) bool {
	p.mu.Lock()
	if p.shut {
		p.mu.Unlock()
		return false
	}
	p.inbox = append(p.inbox, f)
	p.mu.Unlock()
	p.queued.Store(true)
	if p.asleep.Load() && p.posted.CompareAndSwap(false, true) {
		var one = [8]byte{1}
		if _, err := unix.Write(p.wake, one[:]); err != nil && err != unix.EAGAIN {
			p.posted.Store(false) // not woken: the loop finds f at its next tick
		}
	}
	return true
}

// Wait waits up to tick for events (not at all when work was posted
// meanwhile), and reports how many. The eventfd's own event is consumed
// here and counted out.
//
// It looks first without sleeping, in a raw system call (see peek): a
// busy loop finds its next events there and never tells the Go scheduler
// it is in a system call. Only when nothing is ready does it wait in a
// call the scheduler knows may block.
func (p *Poller) Wait(events []unix.EpollEvent, tick time.Duration) (int, error) {
	n, err := peek(p.ep, events)
	if err == nil && n == 0 {
		timeout := int(tick / time.Millisecond)
		p.asleep.Store(true)
		if !p.queued.Load() { // posted while the last pass ran: do not sleep
			n, err = unix.EpollWait(p.ep, events, timeout)
		}
		p.asleep.Store(false)
	}
	if err != nil {
		if err == unix.EINTR {
			return 0, nil
		}
		return 0, err
	}
	for i := 0; i < n; i++ {
		if int(events[i].Fd) == p.wake {
			var b [8]byte
			_, _ = unix.Read(p.wake, b[:]) // EAGAIN at most: nothing to read is as good
			p.posted.Store(false)
			events[i] = events[n-1]
			n--
			break
		}
	}
	return n, nil
}

// Take returns what was posted since the last Take, nil if nothing.
func (p *Poller) Take() []func() {
	if !p.queued.Load() {
		return nil
	}
	p.queued.Store(false) // before taking the inbox: a later post sets it again
	p.mu.Lock()
	work := p.inbox
	p.inbox = nil
	p.mu.Unlock()
	return work
}

// Shut makes Post refuse from now on and returns what was posted and not
// taken: the stopped loop's owner runs it, so nothing posted is lost.
func (p *Poller) Shut() []func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shut = true
	work := p.inbox
	p.inbox = nil
	return work
}

// Close closes the epoll instance and the eventfd.
func (p *Poller) Close() {
	unix.Close(p.ep)
	unix.Close(p.wake)
}

// peek is epoll_wait(2) with a timeout of 0, made as a raw system call,
// one the Go scheduler is not told of: it never blocks, so the runtime has
// no reason to take the loop thread's processor meanwhile (see
// uring.Ring.Submit, and "Threads" in docs/loops.md).
func peek(ep int, events []unix.EpollEvent) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}
