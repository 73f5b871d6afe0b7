// Package uring batches non-blocking socket reads and writes into one
// system call, through a Linux io_uring (io_uring(7)).
//
// It is the smallest part of io_uring an event loop needs: a loop that
// already knows which sockets are ready queues a recv or a send for each,
// then Submit makes them all in one io_uring_enter and returns once every
// one has its result. Every operation carries MSG_DONTWAIT, so the kernel
// makes it at once, as a read(2) or write(2) on a non-blocking socket
// would, and answers EAGAIN rather than waiting: Submit never blocks on a
// socket. On machines where a system call is dear (a virtual machine with
// page-table isolation and no PCID makes one cost several microseconds),
// one io_uring_enter for twenty sockets costs a fraction of twenty reads.
// New refuses a kernel older than Linux 5.12, or one without recv and
// send in its io_uring: the caller then makes its calls one by one.
//
// A Ring belongs to one OS thread, the one that made it (it is set up as
// IORING_SETUP_SINGLE_ISSUER where the kernel knows it): its user calls
// runtime.LockOSThread first and never shares it. The ring holds the
// buffers given to Recv and Send (which puts them on the heap, where they
// do not move) until Submit returns, and the caller must not touch them
// meanwhile; after that the kernel holds no reference to them.
package uring
