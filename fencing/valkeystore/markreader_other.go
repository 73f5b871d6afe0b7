//go:build !linux

package valkeystore

import (
	"errors"
	"net"

	"github.com/fencegate/fencegate/fencing"
)

// Mark readers serve the gate's event loops, which run on Linux only.
const markReadersSupported = false

func newMarkReader(*Store, *net.TCPConn) (fencing.MarkReader, error) {
	return nil, errors.New("valkeystore: mark readers need Linux")
}
