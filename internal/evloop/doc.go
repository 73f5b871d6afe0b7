// Package evloop is the protocol-free part of an event loop on Linux: an
// epoll poller with an eventfd inbox other goroutines post work to, and a
// non-blocking socket's edge-triggered readiness and unread input. It knows
// nothing of HTTP; the gate's loops (proxy/loop*_linux.go) build their
// state machine on it, and internal/uring batches the reads and writes.
//
// A Poller and the Socks it watches belong to one goroutine, the loop's;
// only Post (and Shut's refusal of it) is safe from other goroutines.
package evloop
