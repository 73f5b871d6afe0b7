package proxy

import (
	"net"

	"github.com/fencegate/fencegate/internal/canned"
)

// gateVersions is the detail of the gate's 505 answer (see internal/canned).
const gateVersions = "the gate speaks HTTP/1.x here (and HTTP/2 by TLS ALPN, or with prior knowledge when FENCEGATE_PROXY_H2C is on)"

// cannedListener wraps each accepted connection so that net/http's canned
// plain-text answers become problem answers (see internal/canned).
func cannedListener(l net.Listener) net.Listener {
	return canned.Listener{Listener: l, Versions: gateVersions}
}

// problemConn wraps c as cannedListener does.
func problemConn(c net.Conn) net.Conn { return canned.Conn{Conn: c, Versions: gateVersions} }
