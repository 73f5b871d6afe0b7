package proxy

import (
	"net/http"
	"strconv"

	"github.com/fencegate/fencegate/fencing/problem"
)

// contentLengthProblem is the refusal of an HTTP/2 request whose
// content-length is not one number, or nil. net/http's HTTP/2 server reads
// such a value as 0 and runs the handler while the body may still arrive
// (it resets the stream when it does): taken at its word, the gate would
// judge and forward a write without the body its client sent. net/http's
// HTTP/1.1 reader refuses such a head itself.
func contentLengthProblem(r *http.Request) *problem.Error {
	v, ok := r.Header["Content-Length"]
	if r.ProtoMajor < 2 || !ok {
		return nil
	}
	if len(v) == 1 {
		if _, err := strconv.ParseUint(v[0], 10, 63); err == nil {
			return nil // what net/http reads too
		}
	}
	return problem.New(http.StatusBadRequest, "invalid-request", "the request's content-length is not one decimal number")
}
