package leaseapi_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/internal/certs/certstest"
	"github.com/fencegate/fencegate/leaseapi"
)

// TestClientWithTLSConfig: a private CA and a client certificate reach a
// mutual-TLS API, over HTTP/2; without them the call fails and nothing is
// done.
func TestClientWithTLSConfig(t *testing.T) {
	set := certstest.New(t)
	store := memstore.New(memstore.Options{})
	var proto string
	api := leaseapi.NewServer(leaseapi.Options{Store: store})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto = r.Proto
		api.ServeHTTP(w, r)
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{set.Server.TLS(t)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: set.CA.Pool()}
	srv.StartTLS()
	defer srv.Close()

	ctx := context.Background()
	good := leaseapi.NewClient(srv.URL, leaseapi.WithTLSConfig(&tls.Config{RootCAs: set.CA.Pool(), Certificates: []tls.Certificate{set.Client.TLS(t)}}))
	lease, err := good.Acquire(ctx, "job:1", leaseapi.AcquireOptions{Owner: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if proto != "HTTP/2.0" {
		t.Errorf("served over %s, want HTTP/2 by ALPN", proto)
	}
	// With WithHTTPClient too: the TLS settings apply to its transport.
	viaHC := leaseapi.NewClient(srv.URL, leaseapi.WithHTTPClient(&http.Client{}), leaseapi.WithTLSConfig(&tls.Config{RootCAs: set.CA.Pool(), Certificates: []tls.Certificate{set.Client.TLS(t)}}))
	if _, err := viaHC.Status(ctx, "job:1"); err != nil {
		t.Fatalf("WithHTTPClient and WithTLSConfig: %v", err)
	}

	noCert := leaseapi.NewClient(srv.URL, leaseapi.WithTLSConfig(&tls.Config{RootCAs: set.CA.Pool()}))
	noCA := leaseapi.NewClient(srv.URL, leaseapi.WithTLSConfig(&tls.Config{Certificates: []tls.Certificate{set.Client.TLS(t)}}))
	for name, c := range map[string]*leaseapi.Client{"no client certificate": noCert, "no CA": noCA} {
		_, err := c.Acquire(ctx, "job:2", leaseapi.AcquireOptions{Owner: "w"})
		switch {
		case err == nil:
			t.Errorf("%s: acquire succeeded", name)
		case name == "no CA" && (!errors.Is(err, leaseapi.ErrUnreachable) || errors.Is(err, fencing.ErrAmbiguous)):
			// This side refused the server's certificate: nothing was
			// sent, so unreachable, not ambiguous. (The server's refusal
			// of the client's certificate comes after the client has
			// finished its side of a TLS 1.3 handshake; over HTTP/2 it
			// may surface only as a connection that could not be used.)
			t.Errorf("%s: acquire: %v; want ErrUnreachable", name, err)
		}
	}
	st, err := good.Status(ctx, "job:2")
	if err != nil || st.Lease != nil {
		t.Fatalf("job:2 after refused handshakes: %+v %v; want no lease", st, err)
	}
	if st, _ := good.Status(ctx, "job:1"); st.Lease == nil || st.Lease.Token != lease.Token {
		t.Fatalf("job:1: %+v", st)
	}
}
