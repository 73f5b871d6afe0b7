//go:build linux

package proxy

import (
	"net"
	"syscall"
)

// peerClosed reports whether the upstream has closed c, or sent on it
// what no request asked for, as far as its socket tells now: one
// recv(MSG_PEEK|MSG_DONTWAIT), which takes nothing from the socket and
// runs beside the transport's goroutine blocked reading it (Control takes
// no read lock). Nothing to read yet (EAGAIN) is a live, idle connection;
// end of stream, an error (a reset) or pending bytes are not, nor is a
// connection the transport has closed meanwhile. A connection that is not
// a socket is taken as live.
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	cerr := rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if err == syscall.EINTR {
				continue
			}
			closed = err != syscall.EAGAIN
			return
		}
	})
	return closed || cerr != nil // cerr: the transport has closed it already
}
