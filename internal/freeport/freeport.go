// Package freeport picks loopback TCP ports for servers that tests start
// as separate processes and must name a port before the server binds it
// (a server process cannot hand back a listener the way net.Listen on
// ":0" does in-process).
//
// A port the kernel hands out for ":0" comes from its ephemeral range,
// the same range every outgoing connection on the machine takes its local
// port from: on a busy machine one of them can take the port between the
// check and the server's bind, and the server then fails to start. Port
// picks below that range instead, where only another explicit bind can
// collide: at random, skipping the ports it gave out before in this
// process, and checked free by binding it.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the lowest port Port picks, above the ports services
// commonly listen on.
const lowest = 10000

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// Port returns a loopback TCP port that was free a moment ago, below the
// kernel's ephemeral range (from /proc/sys/net/ipv4/ip_local_port_range;
// 32768 where that cannot be read), never the same twice in one process.
// Where the range starts too low to leave room below it, Port asks the
// kernel for an ephemeral port.
func Port() (int, error) { return PortPair(0) }

// PortPair is Port for a server that also binds the port offset above
// its own, such as a Valkey cluster node's bus (offset 10000): both ports
// lie below the kernel's ephemeral range and were free a moment ago, and
// neither is given out again in this process. Offset 0 is Port.
func PortPair(offset int) (int, error) {
	top := ephemeralStart() - offset
	if top-lowest < 1000 {
		if offset != 0 {
			return 0, fmt.Errorf("freeport: no room for a pair %d apart below the ephemeral range", offset)
		}
		return kernelPort()
	}
	mu.Lock()
	defer mu.Unlock()
	for range 100 {
		p := lowest + rand.IntN(top-lowest)
		if given[p] || given[p+offset] || !free(p) || offset != 0 && !free(p+offset) {
			continue
		}
		given[p], given[p+offset] = true, true
		return p, nil
	}
	return 0, errors.New("freeport: no free port found below the ephemeral range in 100 tries")
}

// free reports whether loopback port p can be bound now.
func free(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Addr is Port as "127.0.0.1:port".
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return n
}

func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("freeport: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
