package h1

import (
	"net/http"
	"strconv"
)

// AppendStatusLine appends an HTTP/1.1 status line: the reason as given,
// or the standard one for status when reason is empty.
func AppendStatusLine(dst []byte, status int, reason []byte) []byte {
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	if len(reason) > 0 {
		dst = append(dst, reason...)
	} else {
		dst = append(dst, http.StatusText(status)...)
	}
	return append(dst, "\r\n"...)
}

// AppendField appends one header field line. name and value must be
// valid (as the parsers here accept them): nothing is escaped.
func AppendField(dst []byte, name, value []byte) []byte {
	return append(append(append(append(dst, name...), ": "...), value...), "\r\n"...)
}

// AppendContentLength appends a Content-Length field of n.
func AppendContentLength(dst []byte, n int64) []byte {
	dst = append(dst, "Content-Length: "...)
	dst = strconv.AppendInt(dst, n, 10)
	return append(dst, "\r\n"...)
}
