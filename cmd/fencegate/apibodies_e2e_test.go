package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/internal/certs/certstest"
	"github.com/fencegate/fencegate/internal/h2test"
	"github.com/fencegate/fencegate/leaseapi"
)

// TestAPICheckpointFloodMemory: the binary as deployed (memory store,
// default connection caps and body budget, GOMEMLIMIT 115 MiB under the
// deployment's 128 MiB limit). 1,000 connections from 8 loopback addresses
// (125 each, within the per-client connection share) each send a
// checkpoint call of the largest body the API accepts and stall before
// its last byte. The API holds the bodies its budget covers (7) and
// answers the others 503 overloaded at once; then the held ones finish
// and are decoded at once. The process's RSS stays, over all of it,
// within idle + 4 x the budget (a body is about twice in memory while it
// is decoded, its bytes and its state, and the collector lets as much
// garbage again build up) + 32 KiB a connection (its goroutine and
// buffers): 88 MiB or so with the default budget, within the deployment's
// 128 MiB limit (measured: 58 MiB during the flood, 65 MiB once the held
// calls were decoded). Without the budget every body was held: 1,000
// such calls took the binary past 1.3 GiB.
func TestAPICheckpointFloodMemory(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc")
	}
	const addrs, perAddr = 8, 125
	const conns = addrs * perAddr
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "GOMEMLIMIT=115MiB"}, "api")
	pid := p.cmd.Process.Pid
	idle := procMemory(t, pid, "VmRSS")
	cfg, err := config.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	budget := int64(cfg.APIBodyMemory)
	bound := idle + 4*budget + conns*(32<<10)

	body := []byte(`{"owner":"w","token":1,"state":"` + strings.Repeat("a", cfg.MaxCheckpointBytes-2) + `"}`)
	// Every address could take more: the total binds, less the eighth
	// kept for small calls.
	held := int((budget - budget/8) / int64(len(body)))
	type call struct {
		conn   net.Conn
		status chan int // the answer's status; 0 when none could be read
	}
	calls := make([]call, 0, conns)
	for a := range addrs {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+a))}, Timeout: 5 * time.Second}
		for i := range perAddr {
			c, err := d.Dial("tcp", p.addr["api"])
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cl := call{conn: c, status: make(chan int, 1)}
			calls = append(calls, cl)
			go func() {
				fmt.Fprintf(c, "PUT /v1/leases/flood:%d:%d/checkpoint HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", a, i, len(body))
				_, _ = c.Write(body[:len(body)-1])
			}()
			go func() {
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					cl.status <- 0
					return
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Content-Type") != "application/problem+json" {
					cl.status <- -1 // not the budget's answer
					return
				}
				cl.status <- resp.StatusCode
			}()
		}
	}

	answered := map[int]int{} // by status
	var peak int64
	var waiting []call
	deadline := time.Now().Add(60 * time.Second) // against a hang only
	for {
		peak = max(peak, procMemory(t, pid, "VmRSS"))
		if peak > bound {
			t.Fatalf("RSS %.1f MiB during the flood of %d connections, past %.1f MiB (idle %.1f MiB + 4 x the %d MiB body budget + 32 KiB a connection); answers so far %v",
				float64(peak)/(1<<20), conns, float64(bound)/(1<<20), float64(idle)/(1<<20), budget>>20, answered)
		}
		waiting = waiting[:0]
		for _, c := range calls {
			select {
			case s := <-c.status:
				answered[s]++
				c.status <- s // keep it readable
			default:
				waiting = append(waiting, c)
			}
		}
		if len(waiting) <= held {
			break
		}
		clear(answered)
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls unanswered, want %d", len(waiting), conns, held)
		}
		time.Sleep(10 * time.Millisecond)
	}
	hwm := procMemory(t, pid, "VmHWM")
	t.Logf("idle RSS %.1f MiB; %d stalled checkpoint calls of %d bytes from %d addresses: %d held, answers %v; RSS at most %.1f MiB sampled, %.1f MiB high-water (bound %.1f MiB)",
		float64(idle)/(1<<20), conns, len(body), addrs, len(waiting), answered, float64(peak)/(1<<20), float64(hwm)/(1<<20), float64(bound)/(1<<20))
	if hwm > bound {
		t.Fatalf("high-water RSS %.1f MiB during the flood, past %.1f MiB", float64(hwm)/(1<<20), float64(bound)/(1<<20))
	}
	if len(waiting) != held || answered[http.StatusServiceUnavailable] != conns-held {
		t.Fatalf("%d calls held, answers %v; want %d held and the %d others answered 503 overloaded", len(waiting), answered, held, conns-held)
	}

	// The held calls end when their last byte comes: lease-lost (the
	// flood holds no lease).
	for _, c := range waiting {
		_, _ = c.conn.Write(body[len(body)-1:])
	}
	for _, c := range waiting {
		select {
		case s := <-c.status:
			if s != http.StatusConflict {
				t.Errorf("a held call, finished: status %d, want 409", s)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a held call was not answered after its last byte")
		}
	}
	hwm = procMemory(t, pid, "VmHWM")
	t.Logf("high-water RSS once the held calls were answered: %.1f MiB", float64(hwm)/(1<<20))
	if hwm > bound {
		t.Fatalf("high-water RSS %.1f MiB, past %.1f MiB (idle %.1f MiB + 4 x the %d MiB body budget + 32 KiB a connection)",
			float64(hwm)/(1<<20), float64(bound)/(1<<20), float64(idle)/(1<<20), budget>>20)
	}
}

// TestAPIOverHTTP2BoundsStreams: the binary's lease API over TLS speaks
// HTTP/2 with the bounds of leaseapi.HTTP2Config, not net/http's defaults
// (250 streams, 1 MiB receive windows), and its default body budget.
func TestAPIOverHTTP2BoundsStreams(t *testing.T) {
	set := certstest.New(t)
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:",
		"FENCEGATE_API_TLS_CERT=" + set.ServerCert, "FENCEGATE_API_TLS_KEY=" + set.ServerKey, "FENCEGATE_TLS_WATCH=0"}, "api")
	conn, err := tls.Dial("tcp", p.addr["api"], &tls.Config{RootCAs: set.CA.Pool(), NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if proto := conn.ConnectionState().NegotiatedProtocol; proto != "h2" {
		t.Fatalf("ALPN chose %q", proto)
	}
	settings, connWindow, err := h2test.ServerSettings(conn, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if settings[http2.SettingMaxConcurrentStreams] != leaseapi.MaxConcurrentStreams || settings[http2.SettingInitialWindowSize] != 64<<10 || connWindow != 256<<10 {
		t.Fatalf("settings %v, connection window %d: want %d streams, 64 KiB a stream, 256 KiB a connection",
			settings, connWindow, leaseapi.MaxConcurrentStreams)
	}
	if cfg, err := config.Load(nil); err != nil || cfg.APIBodyMemory != leaseapi.DefaultBodyMemory {
		t.Fatalf("FENCEGATE_API_BODY_MEMORY's default %d, leaseapi.DefaultBodyMemory %d (%v)", cfg.APIBodyMemory, leaseapi.DefaultBodyMemory, err)
	}
}
