package proxy

import (
	"net/http"
	"testing"
)

// TestIsGRPC: a request is a gRPC call, refused in gRPC's form, when any
// of its Content-Type fields names gRPC; with several fields (malformed,
// forwarded as they came), the upstream may read any of them (grpc-go
// reads the last), and a gRPC client cannot read a problem+json refusal.
func TestIsGRPC(t *testing.T) {
	for _, tc := range []struct {
		types []string
		want  bool
	}{
		{nil, false},
		{[]string{"application/json"}, false},
		{[]string{"application/grpc"}, true},
		{[]string{"application/grpc+proto"}, true},
		{[]string{"application/grpc;charset=utf-8"}, true},
		{[]string{"application/grpc-web"}, false},
		{[]string{"application/grpcx"}, false},
		{[]string{"text/plain", "application/grpc"}, true},
		{[]string{"application/grpc", "text/plain"}, true},
	} {
		r := &http.Request{Header: http.Header{}}
		for _, v := range tc.types {
			r.Header.Add("Content-Type", v)
		}
		if got := isGRPC(r); got != tc.want {
			t.Errorf("Content-Type %q: isGRPC = %v, want %v", tc.types, got, tc.want)
		}
	}
}
