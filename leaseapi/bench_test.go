package leaseapi_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/leaseapi"
)

// BenchmarkAcquire measures the lease API's own cost of one acquisition of
// a fresh resource (routing, middleware, telemetry, decoding the body,
// encoding the answer) on the memory store, without the network: the CPU
// every store pays per lease call. With telemetry, an SDK meter provider
// records the HTTP server metrics as the fencegate binary does.
func BenchmarkAcquire(b *testing.B) {
	for _, tel := range []bool{false, true} {
		b.Run("telemetry="+strconv.FormatBool(tel), func(b *testing.B) {
			opts := leaseapi.Options{Store: memstore.New(memstore.Options{})}
			if tel {
				opts.MeterProvider = sdkmetric.NewMeterProvider()
			}
			api := leaseapi.NewServer(opts)
			const body = `{"owner":"bench","ttl_seconds":60}`
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				r := httptest.NewRequest(http.MethodPost, "/v1/leases/r-"+strconv.Itoa(i)+"/acquire", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				api.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					b.Fatalf("acquire: %d %s", w.Code, w.Body)
				}
			}
		})
	}
}
