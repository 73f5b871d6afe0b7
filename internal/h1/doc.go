// Package h1 holds the pure HTTP/1.1 byte helpers of the gate's event
// loops: finding and checking a head's end, parsing a request or a
// response head, following a chunked body's framing as it is relayed, and
// writing the head bytes the loops send.
//
// Every parser here accepts a strict subset of HTTP/1.1 (RFC 9112): CRLF
// line ends only, no obs-fold, header names of token characters with the
// colon right after them, field values of the bytes net/textproto accepts,
// at most one Content-Length (digits only) and a Transfer-Encoding that is
// exactly "chunked" and never beside a Content-Length. The contract, held
// by the fuzz targets against net/http as the oracle
// (http.ReadRequest, http.ReadResponse, httputil.NewChunkedReader): what
// these parsers accept, net/http reads the same way (same method, target,
// Host, fields, framing, end of body, connection close). They may refuse
// what net/http would accept; the caller then hands the bytes to a general
// parser, or answers 502 for an upstream's response. They never accept
// what net/http would read differently, and never panic, whatever the
// bytes.
//
// Parsed fields alias the head they were parsed from: they are valid until
// the caller reuses that buffer.
package h1
