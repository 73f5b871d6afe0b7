package proxy

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/fencing/problem"
)

// gRPC calls (DESIGN §11): a request whose Content-Type is application/grpc
// or application/grpc+… is judged, admitted and forwarded like any write
// (its path is /package.Service/Method, its token and resource the
// fencing-token and fencing-resource metadata, i.e. the same headers). A
// refusal is a gRPC answer: HTTP 200, a trailers-only response whose
// grpc-status maps the problem's code, grpc-message its detail
// (percent-encoded), fencing-code the code, and the problem's numeric
// members as fencing-… fields.

// isGRPC reports whether r is a gRPC call: whether any of its Content-Type
// fields names gRPC. A request with several (malformed: the field is a
// singleton) goes on with all of them, and servers differ on which one
// they read (grpc-go reads the last), so a refusal is given in gRPC's form
// whenever one of them may make the upstream take it for a gRPC call: a
// gRPC client cannot read a problem+json answer. What is admitted does not
// depend on it.
func isGRPC(r *http.Request) bool {
	for _, ct := range r.Header.Values("Content-Type") {
		if ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;") {
			return true
		}
	}
	return false
}

// gRPC status codes the gate answers with.
const (
	grpcInvalidArgument    = 3
	grpcDeadlineExceeded   = 4
	grpcPermissionDenied   = 7
	grpcFailedPrecondition = 9
	grpcAborted            = 10
	grpcInternal           = 13
	grpcUnavailable        = 14
	grpcUnauthenticated    = 16
)

// grpcStatus maps a problem code to its gRPC status (DESIGN §11).
func grpcStatus(code string) int {
	switch code {
	case "stale-token", "token-not-issued", "lease-not-held":
		return grpcAborted
	case "token-required":
		return grpcFailedPrecondition
	case "invalid-token", "resource-required", "path-not-canonical", "invalid-request", "invalid-body":
		return grpcInvalidArgument
	case "write-denied", "upgrade-denied", "method-override-denied":
		return grpcPermissionDenied
	case "store-unavailable", "barrier-timeout", "upstream-unavailable", "too-many-connections", "gate-stopping":
		return grpcUnavailable
	case "upstream-timeout", "body-timeout":
		return grpcDeadlineExceeded
	case "unauthorized":
		return grpcUnauthenticated
	}
	return grpcInternal
}

// writeGRPCProblem answers a gRPC call with p as a trailers-only response.
func writeGRPCProblem(w http.ResponseWriter, p *problem.Error) {
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", strconv.Itoa(grpcStatus(p.Code)))
	h.Set("Grpc-Message", grpcEscape(p.Detail))
	h.Set("Fencing-Code", p.Code)
	for k, v := range p.Extra {
		h.Set("Fencing-"+strings.ReplaceAll(k, "_", "-"), grpcEscape(fmt.Sprint(v)))
	}
	if ra := p.Headers.Get("Retry-After"); ra != "" {
		h.Set("Retry-After", ra)
	}
	w.WriteHeader(http.StatusOK)
}

// grpcEscape percent-encodes s as grpc-message wants (gRPC's HTTP/2
// protocol: bytes outside 0x20-0x7E, and '%').
func grpcEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c <= 0x7e && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteString(url.PathEscape(string([]byte{c})))
	}
	return b.String()
}
