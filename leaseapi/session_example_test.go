package leaseapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/leaseapi"
)

// A worker holds a lease with a Session and sends its writes through the
// session's Transport: each carries the fencing headers, and none leaves
// after the session ends. Here the "service" is a stand-in that echoes the
// headers it receives; in production, point the client at fencegate's
// write gate (FENCEGATE_PROXY_ADDR).
func ExampleSession_Transport() {
	api := httptest.NewServer(leaseapi.NewServer(leaseapi.Options{Store: memstore.New(memstore.Options{})}))
	defer api.Close()
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("service got %s with Fencing-Token %q, Fencing-Resource %q\n", r.Method, r.Header.Get("Fencing-Token"), r.Header.Get("Fencing-Resource"))
	}))
	defer service.Close()

	ctx := context.Background()
	s, err := leaseapi.NewSession(ctx, leaseapi.NewClient(api.URL), "job:42", leaseapi.SessionOptions{Owner: "worker-a", TTL: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	hc := &http.Client{Transport: s.Transport(nil)}

	resp, err := hc.Post(service.URL+"/jobs/42", "application/json", strings.NewReader(`{"step":1}`))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	resp, err = hc.Get(service.URL + "/jobs/42") // reads are not fenced
	if err != nil {
		panic(err)
	}
	resp.Body.Close()

	if _, err := s.Release(ctx, true); err != nil {
		panic(err)
	}
	<-s.Done()
	_, err = hc.Post(service.URL+"/jobs/42", "application/json", strings.NewReader(`{"step":2}`))
	fmt.Println("after release:", errors.Is(err, leaseapi.ErrWriteRefused), errors.Is(s.Err(), leaseapi.ErrSessionReleased))

	// Output:
	// service got POST with Fencing-Token "1", Fencing-Resource "job:42"
	// service got GET with Fencing-Token "", Fencing-Resource ""
	// after release: true true
}
