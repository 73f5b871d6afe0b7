package leaseapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/internal/apitoken"
)

// DefaultClientTimeout bounds each call of a Client built without
// WithHTTPClient. It exceeds fencing.MaxWait so the longest acquire wait can
// finish; bound individual calls more tightly with their context.
const DefaultClientTimeout = fencing.MaxWait + 30*time.Second

// MaxAnswerBytes bounds the body of a 2xx answer the client reads: the
// largest checkpoint state a server may be configured to keep
// (fencing.MaxCheckpointBytesCeiling) plus room for the rest of the
// document (a full page of fencing.MaxListLimit leases with the longest
// names is under 1 MiB). A larger answer is not the lease API's: the call
// fails with ErrBadAnswer after reading one byte more than this, and the
// rest is never read.
const MaxAnswerBytes = fencing.MaxCheckpointBytesCeiling + 4<<20

// maxProblemBytes bounds how much of a refusal the client reads.
const maxProblemBytes = 1 << 20

// Client calls a fencegate lease API. It is safe for concurrent use.
//
// Errors: a refusal by the server is a *ProblemError, which matches the
// fencing sentinel of its code through errors.Is (lease-held matches
// fencing.ErrLeaseHeld, lease-lost fencing.ErrLeaseLost, and so on) and
// fills *fencing.LeaseHeldError, *fencing.StaleTokenError and
// *fencing.TokenNotIssuedError through errors.As. Arguments the client can
// check itself (resource name, TTL) fail with an error matching
// fencing.ErrInvalid before anything is sent. A transport failure matches
// fencing.ErrUnavailable when the connection could not be made (nothing was
// sent), and fencing.ErrAmbiguous otherwise: the call may or may not have
// taken effect, so a worker must not assume either outcome (it may, for
// instance, acquire again as the same owner, which is idempotent for a live
// lease). The context's error stays matchable with errors.Is.
//
// Lease times in answers are the server's (the store's clock), never the
// client's; compare them with the server's clock, or use TTL instead.
type Client struct {
	base     string // scheme://host[/prefix], no trailing slash
	setupErr error  // a malformed base URL or token: every call fails with it, sending nothing
	hc       *http.Client
	tls      *tls.Config
	token    string
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithHTTPClient makes the Client send its requests through hc (for TLS
// settings, proxies, or instrumentation). Its Timeout, if any, must allow
// for acquire waits. The Client uses a copy that follows no redirect.
func WithHTTPClient(hc *http.Client) ClientOption {
	return func(c *Client) { c.hc = hc }
}

// WithTLSConfig makes the Client use cfg for an https:// API: a private
// CA in RootCAs, a client certificate (Certificates or
// GetClientCertificate) for a mutual-TLS listener. With WithHTTPClient it
// applies to that client's transport when it is an *http.Transport (or
// nil), on a copy. The binary's client commands build cfg from
// FENCEGATE_API_CA_FILE, FENCEGATE_API_CLIENT_CERT and
// FENCEGATE_API_CLIENT_KEY.
func WithTLSConfig(cfg *tls.Config) ClientOption {
	return func(c *Client) { c.tls = cfg }
}

// WithToken sends "Authorization: Bearer <token>" with every call, for a
// server configured with an API token. A token that cannot be sent (a
// space, a control character such as a trailing newline, non-ASCII) makes
// every call fail at once, sending nothing.
func WithToken(token string) ClientOption {
	return func(c *Client) {
		c.token = token
		if !apitoken.Valid(token) {
			c.setupErr = errors.New("leaseapi: the API token holds a space, a control character (a trailing newline?) or a non-ASCII character: it cannot be sent")
		}
	}
}

// NewClient returns a client of the API at baseURL, such as
// "http://127.0.0.1:7070". A malformed baseURL makes every call fail with
// the parse error, sending nothing.
func NewClient(baseURL string, opts ...ClientOption) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/")}
	u, err := url.Parse(c.base)
	switch {
	case err != nil:
		c.setupErr = fmt.Errorf("leaseapi: base URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		c.setupErr = fmt.Errorf("leaseapi: base URL %q: want http://host:port or https://host:port", baseURL)
	}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{Timeout: DefaultClientTimeout}
	}
	if c.tls != nil {
		c.hc = withTLS(c.hc, c.tls)
	}
	// The lease API never redirects: a redirect (a proxy in between, a
	// wrong URL) is an answer to report, not to follow; followed, a POST
	// turns into a GET whose answer could pass for a renewal.
	hc := *c.hc
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.hc = &hc
	return c
}

// withTLS returns a copy of hc whose transport uses cfg. A transport other
// than *http.Transport is kept as it is: it has its own TLS settings.
func withTLS(hc *http.Client, cfg *tls.Config) *http.Client {
	var tr *http.Transport
	switch t := hc.Transport.(type) {
	case nil:
		tr = http.DefaultTransport.(*http.Transport).Clone()
	case *http.Transport:
		tr = t.Clone()
	default:
		return hc
	}
	tr.TLSClientConfig = cfg.Clone()
	tr.ForceAttemptHTTP2 = true
	out := *hc
	out.Transport = tr
	return &out
}

// AcquireOptions describe an acquisition.
type AcquireOptions struct {
	// Owner names the worker; required, see fencing.ValidateOwner.
	Owner string
	// TTL is the lease duration, whole seconds within [1 s, 24 h]; zero
	// means the server's default.
	TTL time.Duration
	// Wait, when positive, lets the server wait up to this long (at most
	// fencing.MaxWait, rounded up to a whole second) for another owner's
	// lease to end.
	Wait time.Duration
}

// Acquire takes the lease on resource for opts.Owner. Re-acquiring a live
// lease as its owner extends it and keeps its token. Another owner's live
// lease: a *ProblemError matching fencing.ErrLeaseHeld (after opts.Wait, if
// set).
func (c *Client) Acquire(ctx context.Context, resource string, opts AcquireOptions) (fencing.Lease, error) {
	body := acquireBody{Owner: opts.Owner}
	if opts.TTL != 0 {
		if err := fencing.ValidateTTL(opts.TTL); err != nil {
			return fencing.Lease{}, err
		}
		body.TTLSeconds = ptr(int64(opts.TTL / time.Second))
	}
	if opts.Wait != 0 {
		if err := fencing.ValidateWait(opts.Wait); err != nil {
			return fencing.Lease{}, err
		}
		body.WaitSeconds = ptr(int64((opts.Wait + time.Second - 1) / time.Second))
	}
	return c.leaseCall(ctx, http.MethodPost, resource, "/acquire", body)
}

// Renew extends the live lease held by owner with token, by ttl (whole
// seconds within [1 s, 24 h]) or, when ttl is zero, by the lease's current
// TTL. Not the live holder (including an expired lease): a *ProblemError
// matching fencing.ErrLeaseLost.
func (c *Client) Renew(ctx context.Context, resource, owner string, token fencing.Token, ttl time.Duration) (fencing.Lease, error) {
	body := renewBody{Owner: owner, Token: token}
	if ttl != 0 {
		if err := fencing.ValidateTTL(ttl); err != nil {
			return fencing.Lease{}, err
		}
		body.TTLSeconds = ptr(int64(ttl / time.Second))
	}
	return c.leaseCall(ctx, http.MethodPost, resource, "/renew", body)
}

// Release ends the lease held by owner with token; finished tells the next
// holder the work is done. It reports false when that lease had already
// ended and no newer token was issued (a repeated release), and a
// *ProblemError matching fencing.ErrLeaseLost when a newer token exists or
// another owner holds the resource.
func (c *Client) Release(ctx context.Context, resource, owner string, token fencing.Token, finished bool) (bool, error) {
	var raw json.RawMessage
	if err := c.call(ctx, http.MethodPost, resource, "/release", releaseBody{Owner: owner, Token: token, Finished: finished}, &raw); err != nil {
		return false, err
	}
	return DecodeReleased(raw)
}

// DecodeReleased reads raw, the body of a 2xx answer to a release, as
// Release does: {"released": true or false}. Anything else (another
// server's JSON) is ErrBadAnswer, not "already ended".
func DecodeReleased(raw []byte) (bool, error) {
	var out struct {
		Released *bool `json:"released"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Released == nil {
		return false, fmt.Errorf("leaseapi: %w", &badAnswerError{status: http.StatusOK, what: "its body is not the lease API's answer to a release", err: err})
	}
	return *out.Released, nil
}

// Checkpoint saves state (marshaled with encoding/json; a json.RawMessage
// is sent as is) for the live lease held by owner with token, and renews
// the lease in the same atomic step. It returns the renewed lease. Not the
// live holder: fencing.ErrLeaseLost; state above the server's limit:
// fencing.ErrTooLarge.
func (c *Client) Checkpoint(ctx context.Context, resource, owner string, token fencing.Token, state any) (fencing.Lease, error) {
	raw, err := json.Marshal(state)
	if err != nil {
		return fencing.Lease{}, fmt.Errorf("leaseapi: checkpoint state: %w", err)
	}
	return c.leaseCall(ctx, http.MethodPut, resource, "/checkpoint", checkpointBody{Owner: owner, Token: token, State: raw})
}

// ReadCheckpoint returns the last checkpoint saved on resource and how the
// previous holder left. No checkpoint: fencing.ErrNoCheckpoint.
func (c *Client) ReadCheckpoint(ctx context.Context, resource string) (fencing.Checkpoint, error) {
	var out checkpointJSON
	if err := c.call(ctx, http.MethodGet, resource, "/checkpoint", nil, &out); err != nil {
		return fencing.Checkpoint{}, err
	}
	at, err := parseTime(out.UpdatedAt)
	if err != nil {
		return fencing.Checkpoint{}, err
	}
	return fencing.Checkpoint{State: out.State, Token: out.Token, UpdatedAt: at, Previous: fromPreviousJSON(out.Previous)}, nil
}

// Status describes resource; an unknown one has zero tokens and nil
// members.
func (c *Client) Status(ctx context.Context, resource string) (fencing.Status, error) {
	var out statusJSON
	if err := c.call(ctx, http.MethodGet, resource, "", nil, &out); err != nil {
		return fencing.Status{}, err
	}
	st := fencing.Status{Resource: out.Resource, Issued: out.Issued, HighWater: out.HighWater, Previous: fromPreviousJSON(out.Previous)}
	if out.Lease != nil {
		l, err := fromLeaseJSON(*out.Lease)
		if err != nil {
			return fencing.Status{}, err
		}
		st.Lease = &l
	}
	if cp := out.Checkpoint; cp != nil {
		at, err := parseTime(cp.UpdatedAt)
		if err != nil {
			return fencing.Status{}, err
		}
		st.Checkpoint = &fencing.CheckpointInfo{Token: cp.Token, UpdatedAt: at, SizeBytes: cp.SizeBytes}
	}
	return st, nil
}

// List returns the live leases whose resource starts with prefix, in
// resource order, at most limit of them (0 means the server's maximum,
// fencing.MaxListLimit): the first page. ListPage reads the next ones;
// Leases and ListAll follow them all.
func (c *Client) List(ctx context.Context, prefix string, limit int) ([]fencing.Lease, error) {
	p, err := c.ListPage(ctx, prefix, limit, "")
	return p.Leases, err
}

// LeasePage is one page of a listing.
type LeasePage struct {
	// Leases are the page's live leases, in resource order.
	Leases []fencing.Lease
	// NextCursor continues the listing (pass it to ListPage); "" when
	// this page is the last.
	NextCursor string
}

// ListQuery is the query of GET /v1/leases for a page of the live leases
// whose resource starts with prefix: at most limit (0: the server's
// maximum), after cursor ("": the first page). Zero values are left out.
func ListQuery(prefix string, limit int, cursor string) url.Values {
	q := url.Values{}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	return q
}

// ListPage returns one page of the live leases whose resource starts with
// prefix: at most limit (0: the server's maximum, fencing.MaxListLimit),
// after cursor ("" for the first page, else a NextCursor the server gave).
func (c *Client) ListPage(ctx context.Context, prefix string, limit int, cursor string) (LeasePage, error) {
	var out listJSON
	if err := c.do(ctx, http.MethodGet, "/v1/leases", "", ListQuery(prefix, limit, cursor), nil, &out); err != nil {
		return LeasePage{}, err
	}
	p := LeasePage{Leases: make([]fencing.Lease, 0, len(out.Leases))}
	for _, lj := range out.Leases {
		l, err := fromLeaseJSON(lj)
		if err != nil {
			return LeasePage{}, err
		}
		p.Leases = append(p.Leases, l)
	}
	if out.NextCursor != nil {
		if *out.NextCursor == "" {
			return LeasePage{}, fmt.Errorf("leaseapi: %w", &badAnswerError{status: http.StatusOK, what: "its next_cursor is empty"})
		}
		p.NextCursor = *out.NextCursor
	}
	return p, nil
}

// Leases iterates over every live lease whose resource starts with prefix,
// in resource order, reading pages of pageSize (0: the server's maximum)
// as the loop goes. A lease live for the whole iteration is yielded
// exactly once; one taken or ended meanwhile may or may not be. A failed
// page, or one whose next_cursor was followed before (pages that would go
// round for ever: ErrBadAnswer), yields its error once and ends the
// iteration.
//
//	for l, err := range client.Leases(ctx, "job:", 0) {
//		if err != nil { ... }
//	}
func (c *Client) Leases(ctx context.Context, prefix string, pageSize int) iter.Seq2[fencing.Lease, error] {
	return func(yield func(fencing.Lease, error) bool) {
		cursor := ""
		seen := map[string]bool{} // the cursors followed
		for {
			p, err := c.ListPage(ctx, prefix, pageSize, cursor)
			if err == nil && seen[p.NextCursor] {
				// A server (or a cache between) answering a page again:
				// following it would yield its leases for ever.
				err = fmt.Errorf("leaseapi: %w", &badAnswerError{status: http.StatusOK, what: "its next_cursor does not move on"})
			}
			if err != nil {
				yield(fencing.Lease{}, err)
				return
			}
			for _, l := range p.Leases {
				if !yield(l, nil) {
					return
				}
			}
			if p.NextCursor == "" {
				return
			}
			cursor = p.NextCursor
			seen[cursor] = true
		}
	}
}

// ListAll returns every live lease whose resource starts with prefix, in
// resource order, following the pages (of pageSize; 0: the server's
// maximum) to the end. See Leases for what a listing sees of leases that
// change meanwhile; prefer Leases for listings too large to hold.
func (c *Client) ListAll(ctx context.Context, prefix string, pageSize int) ([]fencing.Lease, error) {
	all := []fencing.Lease{}
	for l, err := range c.Leases(ctx, prefix, pageSize) {
		if err != nil {
			return nil, err
		}
		all = append(all, l)
	}
	return all, nil
}

func (c *Client) leaseCall(ctx context.Context, method, resource, suffix string, body any) (fencing.Lease, error) {
	var out leaseJSON
	if err := c.call(ctx, method, resource, suffix, body, &out); err != nil {
		return fencing.Lease{}, err
	}
	return leaseOf(out, resource)
}

// DecodeLease reads raw, the body of a 2xx answer to a call about a lease
// on resource (acquire, renew, checkpoint), as the typed methods do: the
// lease, or an error matching ErrBadAnswer (and fencing.ErrAmbiguous) when
// raw is not a lease of resource with a valid fencing token (a positive
// integer) and RFC 3339 times. For tools that pass the answer on as it
// came (Call) but must not pass on one the client would refuse.
func DecodeLease(raw []byte, resource string) (fencing.Lease, error) {
	var out leaseJSON
	if err := json.Unmarshal(raw, &out); err != nil {
		return fencing.Lease{}, fmt.Errorf("leaseapi: %w", &badAnswerError{status: http.StatusOK, what: "its body is not the JSON the lease API sends", err: err})
	}
	return leaseOf(out, resource)
}

// DecodeHeldLease reads raw, the body of a 2xx answer to a renewal or a
// checkpoint of the lease owner holds with token, as DecodeLease does, and
// refuses, as ErrBadAnswer, a lease of another owner or token: what
// answered is not the lease API, or not about this lease.
func DecodeHeldLease(raw []byte, resource, owner string, token fencing.Token) (fencing.Lease, error) {
	l, err := DecodeLease(raw, resource)
	if err == nil && (l.Owner != owner || l.Token != token) {
		err = fmt.Errorf("leaseapi: %w", &badAnswerError{status: http.StatusOK, what: fmt.Sprintf("its lease is another one (%s, token %d, not %s, token %d)", l.Owner, l.Token, owner, token)})
	}
	return l, err
}

// leaseOf is the lease a call about resource was answered with: out
// converted (fromLeaseJSON), and a lease of resource.
func leaseOf(out leaseJSON, resource string) (fencing.Lease, error) {
	l, err := fromLeaseJSON(out)
	if err != nil {
		return fencing.Lease{}, err
	}
	if l.Resource != resource {
		return fencing.Lease{}, fmt.Errorf("leaseapi: %w", &badAnswerError{status: http.StatusOK, what: fmt.Sprintf("its lease names another resource (%q, not %q)", l.Resource, resource)})
	}
	return l, nil
}

// Call sends one request to the API and returns the 2xx answer's body as
// the server sent it, for tools that pass the JSON on unchanged (the
// fencegate CLI does). path is relative to the base URL, such as
// "/v1/leases/job:1/acquire" (escape a resource name with url.PathEscape);
// query, when not empty, is appended; body, when not nil, is sent as JSON.
// Nothing is checked locally. A refusal is a *ProblemError (with Body set),
// a transport failure is classified as for the typed methods.
func (c *Client) Call(ctx context.Context, method, path string, query url.Values, body any) (json.RawMessage, error) {
	var out json.RawMessage
	if err := c.do(ctx, method, path, "", query, body, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// call sends one request about resource to /v1/leases/{resource}+suffix,
// after checking the name locally, and decodes the answer as do does.
func (c *Client) call(ctx context.Context, method, resource, suffix string, body, out any) error {
	if c.setupErr != nil {
		return c.setupErr
	}
	if err := fencing.ValidateResource(resource); err != nil {
		return err
	}
	return c.do(ctx, method, "/v1/leases/"+url.PathEscape(resource)+suffix, resource, nil, body, out)
}

// do sends one request to path and decodes a 2xx answer into out, or a
// refusal into a *ProblemError about resource (empty for the collection).
func (c *Client) do(ctx context.Context, method, path, resource string, query url.Values, body, out any) error {
	if c.setupErr != nil {
		return c.setupErr
	}
	target := c.base + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("leaseapi: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return fmt.Errorf("leaseapi: %w", err)
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return transportError(method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return readProblem(resp, resp.Body, resource)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
	switch {
	case err != nil:
		return fmt.Errorf("leaseapi: %s %s: %w", method, path, &badAnswerError{status: resp.StatusCode, what: "its body was cut off", err: err})
	case len(raw) > MaxAnswerBytes:
		return fmt.Errorf("leaseapi: %s %s: %w", method, path, &badAnswerError{status: resp.StatusCode, what: fmt.Sprintf("its body is larger than %d bytes, more than the lease API ever sends", MaxAnswerBytes)})
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("leaseapi: %s %s: %w", method, path, &badAnswerError{status: resp.StatusCode, what: "its body is not the JSON the lease API sends", err: err})
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("leaseapi: %w", &badAnswerError{status: http.StatusOK, what: "holds a time that is not RFC 3339", err: err})
	}
	return t.UTC(), nil
}

// fromLeaseJSON converts a lease as the API sends it. A lease always has a
// token (tokens start at 1): one without (a JSON null, {}, or token 0) is
// not the API's answer, and its holder must not be given token 0.
func fromLeaseJSON(l leaseJSON) (fencing.Lease, error) {
	if l.Token == 0 {
		return fencing.Lease{}, fmt.Errorf("leaseapi: %w", &badAnswerError{status: http.StatusOK, what: "holds a lease without a fencing token (none, or 0)"})
	}
	acq, err := parseTime(l.AcquiredAt)
	if err != nil {
		return fencing.Lease{}, err
	}
	exp, err := parseTime(l.ExpiresAt)
	if err != nil {
		return fencing.Lease{}, err
	}
	return fencing.Lease{Resource: l.Resource, Owner: l.Owner, Token: l.Token, TTL: time.Duration(l.TTLSeconds) * time.Second, AcquiredAt: acq, ExpiresAt: exp}, nil
}

func fromPreviousJSON(p *previousJSON) *fencing.Previous {
	if p == nil {
		return nil
	}
	return &fencing.Previous{Owner: p.Owner, Token: p.Token, Ended: p.Ended, Finished: p.Finished}
}
