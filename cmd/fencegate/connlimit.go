package main

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/internal/canned"
	"github.com/fencegate/fencegate/internal/connlimit"
	"github.com/fencegate/fencegate/leaseapi"
)

// healthReserve is how many connections the lease API accepts beyond its cap.
// They are served only for health checks (other requests get 503
// too-many-connections and the connection is closed), so /livez and
// /readyz keep answering while slow or abusive clients fill the cap.
const healthReserve = 32

// newConnLimit caps ln at max connections, plus reserve kept for health
// checks: the first max are served normally, the next reserve are marked
// overflow (see overflowHandler), and any beyond those get the 503
// too-many-connections answer and are closed (see connlimit). One client
// (connlimit.Client) may hold at most perClient of them, the reserve
// included (0: no per-client cap); one beyond gets the same answer.
func newConnLimit(ln net.Listener, max, reserve, perClient int) *connlimit.Listener {
	return &connlimit.Listener{Listener: ln, Counter: connlimit.NewCounter(max, reserve, perClient)}
}

type overflowKey struct{}

// connContext marks the requests of an overflow connection, and gives
// every connection the record the lease API's authentication keeps of it
// (leaseapi.ConnContext); it is the listener's http.Server.ConnContext.
func connContext(ctx context.Context, c net.Conn) context.Context {
	ctx = leaseapi.ConnContext(ctx, c)
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	c = canned.Unwrap(c)
	if lc, ok := c.(*connlimit.Conn); ok && lc.Overflow {
		return context.WithValue(ctx, overflowKey{}, true)
	}
	return ctx
}

// overflowHandler serves the requests of overflow connections: those that
// health says yes to go to h (and the connection is then closed), the rest
// get the 503 too-many-connections answer, counted as refused in conns, and
// the connection is closed at once, without the lingering close net/http
// gives a request whose body was not read, to free its place.
func overflowHandler(h http.Handler, health func(*http.Request) bool, conns *connlimit.Counter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(overflowKey{}) == nil {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		if health != nil && health(r) {
			h.ServeHTTP(w, r)
			return
		}
		conns.RefusedInReserve()
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			problem.Write(w, r, nil, problem.TooManyConnections())
			return
		}
		connlimit.Refuse(c)
	})
}

// isHealthCheck says whether r is a liveness or readiness probe.
func isHealthCheck(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/livez" || r.URL.Path == "/readyz")
}
