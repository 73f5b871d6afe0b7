package proxy

import (
	"net/http"
	"strconv"

	"github.com/fencegate/fencegate/fencing/problem"
)

// contentLengthProblem is the refusal of an HTTP/2 request whose
// content-length is not one number, or that declares content its stream
// ended without (END_STREAM on its HEADERS), or nil. net/http's HTTP/2
// server reads a value that is not a number as 0 and runs the handler
// while the body may still arrive (it resets the stream when it does), and
// gives a stream that ended with its headers an empty body whatever its
// content-length says: taken at its word, the gate would judge and forward
// a write without the body its client declared, where RFC 9113 §8.1.1 has
// an intermediary forward no such malformed request. net/http's HTTP/1.1
// reader refuses such a head itself, or waits for the declared body. (A
// stream whose DATA disagrees with its content-length is reset by
// net/http; a fenced write's small body is read to its stream's end before
// it is forwarded, see Gate.bufferBody.)
func contentLengthProblem(r *http.Request) *problem.Error {
	v, ok := r.Header["Content-Length"]
	if r.ProtoMajor < 2 || !ok {
		return nil
	}
	if len(v) == 1 {
		n, err := strconv.ParseUint(v[0], 10, 63)
		switch {
		case err != nil:
		case n > 0 && r.ContentLength == 0:
			return problem.New(http.StatusBadRequest, "invalid-request",
				"the request's content-length is "+v[0]+" but its stream ended with its headers, without content")
		default:
			return nil // what net/http reads too
		}
	}
	return problem.New(http.StatusBadRequest, "invalid-request", "the request's content-length is not one decimal number")
}
