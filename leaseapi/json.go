package leaseapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/problem"
)

// Wire types: the JSON the API speaks. Both the server and the client use
// them, so the two cannot drift apart.

type leaseJSON struct {
	Resource   string        `json:"resource"`
	Owner      string        `json:"owner"`
	Token      fencing.Token `json:"token"`
	TTLSeconds int64         `json:"ttl_seconds"`
	AcquiredAt string        `json:"acquired_at"`
	ExpiresAt  string        `json:"expires_at"`
}

type previousJSON struct {
	Owner    string         `json:"owner"`
	Token    fencing.Token  `json:"token"`
	Ended    fencing.Ending `json:"ended"`
	Finished bool           `json:"finished"`
}

type checkpointInfoJSON struct {
	Token     fencing.Token `json:"token"`
	UpdatedAt string        `json:"updated_at"`
	SizeBytes int           `json:"size_bytes"`
}

type statusJSON struct {
	Resource   string              `json:"resource"`
	Issued     fencing.Token       `json:"issued_token"`
	HighWater  fencing.Token       `json:"high_water_token"`
	Lease      *leaseJSON          `json:"lease"`
	Previous   *previousJSON       `json:"previous"`
	Checkpoint *checkpointInfoJSON `json:"checkpoint"`
}

type checkpointJSON struct {
	State     json.RawMessage `json:"state"`
	Token     fencing.Token   `json:"token"`
	UpdatedAt string          `json:"updated_at"`
	Previous  *previousJSON   `json:"previous"`
}

type releasedJSON struct {
	Released bool `json:"released"`
}

type listJSON struct {
	Leases []leaseJSON `json:"leases"`
	// NextCursor continues the listing after this page; null when the
	// page is the last (shorter than the limit).
	NextCursor *string `json:"next_cursor"`
}

// A list cursor is opaque to clients: the last resource of the page it
// follows, base64url without padding, so that its form may change without
// clients noticing.

func encodeCursor(resource string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(resource))
}

// decodeCursor returns the resource a cursor names; one that cannot be a
// cursor (not base64url, not a resource name) is invalid (field cursor).
// A well-formed cursor is not checked further: listing continues after the
// name it holds.
func decodeCursor(c string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || fencing.ValidateResource(string(b)) != nil {
		return "", &fencing.ValidationError{Field: "cursor", Reason: "is not a cursor this API gave (use next_cursor as answered)"}
	}
	return string(b), nil
}

type acquireBody struct {
	Owner       string `json:"owner"`
	TTLSeconds  *int64 `json:"ttl_seconds,omitempty"`
	WaitSeconds *int64 `json:"wait_seconds,omitempty"`
}

type renewBody struct {
	Owner      string        `json:"owner"`
	Token      fencing.Token `json:"token"`
	TTLSeconds *int64        `json:"ttl_seconds,omitempty"`
}

type releaseBody struct {
	Owner    string        `json:"owner"`
	Token    fencing.Token `json:"token"`
	Finished bool          `json:"finished,omitempty"`
}

type checkpointBody struct {
	Owner string          `json:"owner"`
	Token fencing.Token   `json:"token"`
	State json.RawMessage `json:"state"`
}

func toLeaseJSON(l fencing.Lease) leaseJSON {
	return leaseJSON{
		Resource:   l.Resource,
		Owner:      l.Owner,
		Token:      l.Token,
		TTLSeconds: int64(l.TTL / time.Second),
		AcquiredAt: problem.FormatTime(l.AcquiredAt),
		ExpiresAt:  problem.FormatTime(l.ExpiresAt),
	}
}

func toPreviousJSON(p *fencing.Previous) *previousJSON {
	if p == nil {
		return nil
	}
	return &previousJSON{Owner: p.Owner, Token: p.Token, Ended: p.Ended, Finished: p.Finished}
}

func toStatusJSON(st fencing.Status) statusJSON {
	out := statusJSON{Resource: st.Resource, Issued: st.Issued, HighWater: st.HighWater, Previous: toPreviousJSON(st.Previous)}
	if st.Lease != nil {
		l := toLeaseJSON(*st.Lease)
		out.Lease = &l
	}
	if c := st.Checkpoint; c != nil {
		out.Checkpoint = &checkpointInfoJSON{Token: c.Token, UpdatedAt: problem.FormatTime(c.UpdatedAt), SizeBytes: c.SizeBytes}
	}
	return out
}

// writeJSON sends v with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // JSON, never HTML: an owner "<a&b>" reads as sent
	_ = enc.Encode(v)
}

// checkContentType accepts one Content-Type header, application/json, with
// an optional utf-8 charset. A body without Content-Type is refused, and so
// is one with two (Content-Type is a singleton field: which one counts would
// depend on who reads it): see the package doc.
func checkContentType(r *http.Request) error {
	if len(r.Header.Values("Content-Type")) > 1 {
		return problem.New(http.StatusUnsupportedMediaType, "unsupported-media-type",
			"send one Content-Type header: application/json")
	}
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if ct == "" || err != nil || mt != "application/json" {
		got := ct
		switch {
		case got == "":
			got = "none"
		case len(got) > 100:
			got = got[:100] + "..."
		}
		return problem.New(http.StatusUnsupportedMediaType, "unsupported-media-type",
			"the request body must be sent with Content-Type: application/json (got "+got+")")
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return problem.New(http.StatusUnsupportedMediaType, "unsupported-media-type",
			"the request body must be UTF-8 JSON (got charset "+cs+")")
	}
	return nil
}

// decodeBody reads r's body, at most limit bytes, as exactly one JSON object
// into dst, within the server's body budget (bodybudget.go). The body's
// bytes are reserved before any is read (its Content-Length; without one,
// a small body's bytes, and the rest of limit once it grows past them): a
// body the budget cannot cover is refused as overloaded, unread (a body
// without a length, once it outgrows its first reservation). The hold
// returned keeps the bytes the body had reserved until the caller
// releases it, done with dst; on an error nothing stays reserved. Errors are *problem.Error values ready for
// problem.Write.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, limit int64, dst any) (bodyHold, error) {
	if r.ContentLength == 0 && r.Header.Get("Content-Type") == "" {
		return bodyHold{}, errEmptyBody
	}
	if err := checkContentType(r); err != nil {
		return bodyHold{}, err
	}
	if r.ContentLength > limit {
		return bodyHold{}, tooLarge(limit)
	}
	// A body of unknown length (chunked) reserves a small body's bytes
	// first, and the rest of its limit only if it grows past them.
	h := bodyHold{budget: s.bodies, client: limitKey(r), n: min(limit, smallBody)}
	if r.ContentLength >= 0 {
		h.n = r.ContentLength
	}
	if !s.bodies.take(h.client, h.n) {
		return bodyHold{}, overloaded()
	}
	held := false
	defer func() {
		if !held { // an error, or a panic on the way
			h.release()
		}
	}()
	var body io.Reader = http.MaxBytesReader(w, r.Body, limit)
	if r.ContentLength < 0 {
		body = &growingHold{r: body, h: &h, limit: limit}
	}
	raw, err := readBody(body, r.ContentLength, limit)
	if errors.Is(err, errOverBudget) {
		return bodyHold{}, overloaded()
	}
	// Only what was read stays held: what dst holds is no larger.
	kept := min(int64(len(raw)), h.n)
	s.bodies.give(h.client, h.n-kept)
	h.n = kept
	if err := decodeRead(raw, err, limit, dst); err != nil {
		return bodyHold{}, err
	}
	held = true
	return h, nil
}

var errEmptyBody = problem.New(http.StatusBadRequest, "invalid-json", "the request body is empty; expected a JSON object")

func tooLarge(limit int64) error {
	return problem.New(http.StatusRequestEntityTooLarge, "payload-too-large",
		fmt.Sprintf("the request body exceeds the limit of %d bytes", limit))
}

// decodeJSONStream decodes exactly one JSON object from body into dst (a
// pointer to a struct with json tags), refusing unknown members, members
// whose name differs in case from the field's, and repeated members:
// encoding/json would accept the last two silently, so
// {"Owner":"a","owner":"b"} could mean something other than what its sender
// read. limit is only quoted in the too-large message.
//
// The body is read as one JSON value first, so a body that is too large or
// malformed is refused as such (413 or invalid-json) whatever its members;
// only then are the members decoded, each straight into its field, in
// order, the first wrong one named in the refusal.
//
// It is the reference decoder: decodeJSON (decode.go) answers with it
// whenever its own quicker path does not accept a body.
func decodeJSONStream(body io.Reader, limit int64, dst any) error {
	dec := json.NewDecoder(body)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return decodeProblem(err, limit)
	}
	// Exactly one value: anything but end of input after it is refused.
	var extra json.RawMessage
	switch err := dec.Decode(&extra); {
	case err == io.EOF:
	case isMaxBytes(err):
		return tooLarge(limit)
	case isReadFailure(err):
		return errBodyUnread
	default:
		return problem.New(http.StatusBadRequest, "invalid-json", "the request body must hold a single JSON object, with nothing after it")
	}
	return decodeMembers(raw, reflect.ValueOf(dst).Elem())
}

// decodeMembers decodes raw, well-formed JSON, into the struct v: raw must
// be an object whose member names are json names of v's fields, spelled
// exactly, each at most once. A JSON null leaves its field as it is.
func decodeMembers(raw json.RawMessage, v reflect.Value) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return problem.New(http.StatusBadRequest, "invalid-json", "the request body must be a JSON object")
	}
	seen := make([]bool, v.NumField())
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return problem.New(http.StatusBadRequest, "invalid-json", "the request body is not valid JSON")
		}
		name, _ := tok.(string)
		i := fieldIndex(v.Type(), name)
		switch {
		case i < 0:
			return problem.From(&fencing.ValidationError{Field: fmt.Sprintf("%q", truncateName(name)), Reason: "is not a member of this request (names are case-sensitive)"})
		case seen[i]:
			return problem.From(&fencing.ValidationError{Field: fmt.Sprintf("%q", name), Reason: "appears more than once"})
		}
		seen[i] = true
		if err := dec.Decode(v.Field(i).Addr().Interface()); err != nil {
			var typ *json.UnmarshalTypeError
			if errors.As(err, &typ) {
				return problem.New(http.StatusBadRequest, "invalid-request", fmt.Sprintf("%s must be %s", name, describe(typ.Type)))
			}
			return problem.New(http.StatusBadRequest, "invalid-json", "the request body is not valid JSON")
		}
	}
	return nil
}

// fieldIndex returns the index of t's field whose json name is name, or -1.
func fieldIndex(t reflect.Type, name string) int { return indexOf(fieldNames(t), name) }

// truncateName bounds a client-supplied member name quoted in an error.
func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func isMaxBytes(err error) bool {
	var mb *http.MaxBytesError
	return errors.As(err, &mb)
}

// decodeProblem explains an error of reading the body as one JSON value.
// The texts quote only the client's own input and the expected shape.
func decodeProblem(err error, limit int64) error {
	var syntax *json.SyntaxError
	switch {
	case isMaxBytes(err):
		return tooLarge(limit)
	case errors.Is(err, io.EOF):
		return errEmptyBody
	case errors.Is(err, io.ErrUnexpectedEOF):
		return problem.New(http.StatusBadRequest, "invalid-json", "the request body ends before its JSON value is complete")
	case errors.As(err, &syntax):
		return problem.New(http.StatusBadRequest, "invalid-json", fmt.Sprintf("the request body is not valid JSON: %s (at byte %d)", syntax.Error(), syntax.Offset))
	case isReadFailure(err):
		return errBodyUnread
	}
	return problem.New(http.StatusBadRequest, "invalid-json", "the request body is not valid JSON")
}

// errBodyUnread answers a body whose reading failed before its end: it
// stopped arriving within the body timeout (a Content-Length larger than
// what was sent, a client sending byte by byte), or the connection broke.
// Its bytes so far may be valid JSON; the body is refused all the same.
var errBodyUnread = problem.New(http.StatusBadRequest, "invalid-json",
	"the request body could not be read to its end (it stopped arriving before the body timeout, or the connection failed)")

// isReadFailure reports whether err, from decoding a body, is the body's
// reader failing rather than the JSON being wrong or ending early.
func isReadFailure(err error) bool {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) &&
		!errors.As(err, &syntax) && !errors.As(err, &typ) && !isMaxBytes(err)
}

// describe names the JSON shape a Go type accepts.
func describe(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a positive integer"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	}
	return "a JSON value of another type"
}

// seconds turns an optional whole-seconds member into a duration. Absent
// (nil) gives def. Values beyond max are mapped to -1 before multiplying so
// a huge count cannot overflow back into range; validate then refuses them
// with the field's own message.
func seconds(v *int64, def, max time.Duration, validate func(time.Duration) error) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	d := time.Duration(-1)
	if *v >= 0 && *v <= int64(max/time.Second) {
		d = time.Duration(*v) * time.Second
	}
	if err := validate(d); err != nil {
		return 0, err
	}
	return d, nil
}
