//go:build !linux

package proxy

import "net"

// peerClosed is the Linux check of a reused connection (see
// staleconn_linux.go); elsewhere every connection is taken as live, and a
// write on one the upstream had closed fails as net/http's transport
// finds it.
func peerClosed(net.Conn) bool { return false }
