package leaseapi_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/leaseapi"
)

// TestBodyThatStopsArriving: a body that stops before its declared
// Content-Length (here after a complete JSON object) runs into the
// server's read deadline; the refusal says the body could not be read,
// not that something followed the object, and nothing is acquired.
func TestBodyThatStopsArriving(t *testing.T) {
	store := memstore.New(memstore.Options{})
	srv := httptest.NewUnstartedServer(leaseapi.NewServer(leaseapi.Options{Store: store}))
	srv.Config.ReadTimeout = 200 * time.Millisecond // provokes the read failure; not a bound under test
	srv.Start()
	defer srv.Close()

	body := `{"owner":"w"}`
	for _, declared := range []int{len(body) + 50, len(body) + 1} {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/leases/job:1/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", declared, body)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		a := decodeAnswer(resp)
		c.Close()
		wantProblem(t, "a body that stops arriving", a, 400, "invalid-json")
		if !strings.Contains(a.str("detail"), "could not be read") {
			t.Errorf("Content-Length %d, %d bytes sent: detail %q, want it to say the body could not be read", declared, len(body), a.str("detail"))
		}
	}
	e := &env{t: t, srv: srv}
	if st := e.get("/v1/leases/job:1"); st.obj("lease") != nil || st.num("issued_token") != 0 {
		t.Fatalf("status after the refusals: %s", st.raw)
	}
}
