package leaseapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/fencing/reqid"
	"github.com/fencegate/fencegate/internal/connlimit"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// MetricRefusals counts the lease API's refusals (every problem answer of a
// /v1 call, from 401 unauthorized to 409 lease-held) by client and code.
const MetricRefusals = "fencegate.api.refusals"

// noClient is the client label of a refusal before a client was known
// (401, 429) or without an access file.
const noClient = "-"

// clientNote carries the name of the access client a request was
// authenticated as, filled in by authenticate; ServeHTTP puts one in every
// request's context so that middleware around the routes (an access log)
// can read the name once the request is served.
type clientNote struct {
	mu     sync.Mutex
	name   string
	client *access.Client
	cred   credential // what client was found by, to find it again (recheck)
}

// credential is what a request authenticated with by an access file: the
// SHA-256 of its bearer token or, when cert is set, its verified client
// certificate.
type credential struct {
	sum  [sha256.Size]byte
	cert *x509.Certificate
}

// lookup finds the client cred names in p, as authenticate did.
func (c credential) lookup(p *access.Policy) (*access.Client, bool) {
	if c.cert != nil {
		return p.ByCertificate(c.cert)
	}
	return p.ByTokenSum(c.sum)
}

type clientNoteKey struct{}

// ClientName is the name of the access client (FENCEGATE_ACCESS_FILE) that
// made the request of ctx, once it was authenticated, or "" (no access
// file, not yet or not authenticated).
func ClientName(ctx context.Context) string {
	if n, ok := ctx.Value(clientNoteKey{}).(*clientNote); ok {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.name
	}
	return ""
}

// WithClientNote returns ctx ready to receive the client's name, for a
// handler around the Server that reads ClientName after serving.
// ServeHTTP adds one when ctx has none.
func WithClientNote(ctx context.Context) context.Context {
	if _, ok := ctx.Value(clientNoteKey{}).(*clientNote); ok {
		return ctx
	}
	return context.WithValue(ctx, clientNoteKey{}, &clientNote{})
}

// client is the access client of r, nil without an access file.
func client(r *http.Request) *access.Client {
	if n, ok := r.Context().Value(clientNoteKey{}).(*clientNote); ok {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.client
	}
	return nil
}

func setClient(r *http.Request, c *access.Client, cred credential) {
	if n, ok := r.Context().Value(clientNoteKey{}).(*clientNote); ok {
		n.mu.Lock()
		n.name, n.client, n.cred = c.Name, c, cred
		n.mu.Unlock()
	}
}

// credentialOf is the credential r's access client was found by, and
// whether one was (none without an access file).
func credentialOf(r *http.Request) (credential, bool) {
	if n, ok := r.Context().Value(clientNoteKey{}).(*clientNote); ok {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.cred, n.client != nil
	}
	return credential{}, false
}

// authenticate checks the credentials of every /v1 call, before routing
// within /v1, so unauthenticated callers learn nothing about its paths.
//
// With an access file: a bearer token, when the request has one, must be
// a client's (compared by hash, in constant time); without one, a verified
// client certificate's URI or DNS SAN must name a client. Otherwise, with
// AuthToken: the token must be it. Missing or unknown credentials are 401
// unauthorized; an address (limitKey) whose failures are spent gets 429
// too-many-requests with Retry-After, before its credentials are looked at
// and, for calls that raced with the failure that spent them, after: a
// failure is counted only when one is left to spend (a wrong guess is
// told 401 only within the allowance), and a right credential still finds
// the address spent (a guess's rightness is not told by a 429 either).
// A client known by its verified certificate is never held back.
//
// Nor is a connection that a bearer token already authenticated on (see
// ConnContext), for requests with that same token while it is still
// valid: a guesser sharing the address cannot end the leases of the
// clients already connected. Any other request from a spent address is
// 429 as above (its credentials are looked at only on such a connection,
// and a wrong one is told nothing and counted as nothing, as any request
// of a spent address), and a connection that never authenticated is
// closed with its 429, so a client's pool keeps the connection it
// authenticated on rather than a refused one.
func (s *Server) authenticate(next http.Handler) http.Handler {
	if !s.authOn && s.access == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := limitKey(r)
		conn, _ := r.Context().Value(connKey{}).(*connAuth)
		auths := r.Header.Values("Authorization")
		// A verified client certificate, without a header to take its
		// place, is not held back by its address's failures: it cannot
		// be guessed, and holding it back would let a guesser sharing
		// the address lock its clients out. One naming no client still
		// counts as a failure.
		byCert := s.access != nil && auths == nil && r.TLS != nil && len(r.TLS.VerifiedChains) > 0
		wait, spent := s.limiter.Blocked(addr)
		spent = spent && !byCert
		if spent && (conn.token() == nil || len(auths) != 1) {
			s.tooMany(w, r, wait, conn)
			return
		}
		if len(auths) > 1 {
			// Which one counts would depend on who reads the request: a
			// proxy in front may judge the last where this judges the first.
			if wait, blocked := s.limiter.Fail(addr); blocked {
				s.tooMany(w, r, wait, conn)
				return
			}
			s.refuse(w, r, &problem.Error{Status: http.StatusBadRequest, Code: "invalid-request",
				Detail:  "send one Authorization header",
				Headers: http.Header{"Www-Authenticate": {`Bearer realm="fencegate", error="invalid_request"`}}})
			return
		}
		header, sent := "", len(auths) == 1 // at most one by now
		if sent {
			header = auths[0]
		}
		tok, hasTok := bearer(header)
		var sum [sha256.Size]byte
		if hasTok {
			sum = sha256.Sum256([]byte(tok))
		}
		ok := false
		var c *access.Client
		var cred credential
		switch {
		case s.access != nil:
			p := s.access.Policy()
			if hasTok {
				cred.sum = sum
				c, ok = cred.lookup(p)
			} else if !sent && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
				// A header that is there but holds no bearer token (an
				// empty variable, another scheme) is refused, not passed
				// over for the certificate: the client meant to be known
				// by a token.
				cred.cert = r.TLS.VerifiedChains[0][0]
				c, ok = cred.lookup(p)
			}
		case hasTok:
			ok = subtle.ConstantTimeCompare(sum[:], s.authSum[:]) == 1
		}
		if spent {
			// The address is spent, and this connection authenticated
			// before: served only with that same token, still valid.
			if !ok || !hasTok || !conn.holds(sum) {
				s.tooMany(w, r, wait, conn)
				return
			}
		} else if !ok {
			if wait, blocked := s.limiter.Fail(addr); blocked {
				s.tooMany(w, r, wait, conn)
				return
			}
			s.refuse(w, r, s.unauthorized(hasTok))
			return
		} else if wait, blocked := s.limiter.Blocked(addr); blocked && !byCert && !(hasTok && conn.holds(sum)) {
			// Failures that raced with this call spent the address.
			s.tooMany(w, r, wait, conn)
			return
		} else if hasTok {
			conn.pin(sum)
		}
		if c != nil {
			setClient(r, c, cred)
		}
		next.ServeHTTP(w, r)
	})
}

// unauthorized is the 401 of a call whose credentials name no one: a
// bearer token (hasTok) that is not valid, or none that the API knows.
func (s *Server) unauthorized(hasTok bool) *problem.Error {
	detail, www := "this API requires an Authorization: Bearer <token> header", `Bearer realm="fencegate"`
	if hasTok {
		detail, www = "the bearer token is not valid", `Bearer realm="fencegate", error="invalid_token"`
	} else if s.access != nil {
		detail = "this API requires an Authorization: Bearer <token> header or a client certificate it knows"
	}
	return &problem.Error{Status: http.StatusUnauthorized, Code: "unauthorized", Detail: detail,
		Headers: http.Header{"Www-Authenticate": {www}}}
}

// recheck judges r's call again, to op on resource as owner, under the
// access policy in force now: r was authenticated and permitted under the
// one in force when it came, and a reload since may have narrowed or
// removed its client. The client is found again by the credential it
// authenticated with; one the policy no longer knows gets the 401 a fresh
// call would (not counted as a failed authentication: nothing was
// guessed), one no longer allowed the 403. Without an access file, or for
// a call no access client made, it returns nil.
func (s *Server) recheck(r *http.Request, op access.Op, resource, owner string) error {
	cred, ok := credentialOf(r)
	if s.access == nil || !ok {
		return nil
	}
	c, ok := cred.lookup(s.access.Policy())
	if !ok {
		return s.unauthorized(cred.cert == nil)
	}
	setClient(r, c, cred)
	if err := permit(r, op, resource); err != nil {
		return err
	}
	return permitOwner(r, owner)
}

// connKey is the context key of a connection's *connAuth (ConnContext).
type connKey struct{}

// connAuth is what the lease API remembers of one connection: the SHA-256
// of the first bearer token a request on it authenticated with, nil until
// one did. It lives in the connection's context, so it lasts as long as
// the connection; HTTP/2 streams share their connection's.
type connAuth struct {
	sum atomic.Pointer[[sha256.Size]byte]
}

// ConnContext returns ctx carrying a record of the connection c for the
// Server's authentication: a connection on which a bearer token
// authenticated keeps being served for requests with that same token
// while its client address is locked out by failed authentications (429),
// so that another process on the same address (every worker of a sidecar
// connects from 127.0.0.1) cannot, by sending bad tokens, stop the
// clients already connected from renewing their leases. Set it as the
// http.Server's ConnContext, or call it from one; without it, the
// lock-out holds back every token client of the address.
func ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, &connAuth{})
}

// token is the hash of the token that authenticated on the connection, or
// nil (none yet, or no record of the connection: a nil *connAuth).
func (a *connAuth) token() *[sha256.Size]byte {
	if a == nil {
		return nil
	}
	return a.sum.Load()
}

// holds says, in constant time, whether sum is the hash of the token that
// authenticated on the connection.
func (a *connAuth) holds(sum [sha256.Size]byte) bool {
	t := a.token()
	return t != nil && subtle.ConstantTimeCompare(t[:], sum[:]) == 1
}

// pin records sum as the connection's token, unless one is recorded: a
// connection is the first client's that authenticated on it. After the
// first request, it costs an atomic load.
func (a *connAuth) pin(sum [sha256.Size]byte) {
	if a != nil && a.sum.Load() == nil {
		p := new([sha256.Size]byte) // only here: sum itself stays off the heap
		*p = sum
		a.sum.CompareAndSwap(nil, p)
	}
}

// tooMany answers 429 too-many-requests to an address whose failed
// authentications are spent, with the wait in Retry-After. A connection
// that no token authenticated on is closed after the answer: it has
// nothing to wait for that a new one would not have, and closing it keeps
// a client's pool to the connection its token is remembered on.
func (s *Server) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration, conn *connAuth) {
	secs := int((wait + time.Second - 1) / time.Second)
	h := http.Header{"Retry-After": {strconv.Itoa(secs)}}
	if conn.token() == nil {
		h.Set("Connection", "close")
	}
	s.refuse(w, r, &problem.Error{Status: http.StatusTooManyRequests, Code: "too-many-requests",
		Detail:  "too many failed authentications from this address; retry later",
		Headers: h})
}

// remoteHost is the client's address without its port.
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// limitKey is the key the failed authentications of r count under: the
// client as the connection limits know it (connlimit.ClientIP), an IPv4
// address (an IPv4-mapped IPv6 one as the IPv4 one) or the /64 prefix of
// an IPv6 one, which a client can pick any address of; the peer's host as
// given when it is no IP address (a Unix socket's peer).
func limitKey(r *http.Request) string {
	host := remoteHost(r)
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	return connlimit.ClientIP(ip).String()
}

// refuse writes an authentication or permission refusal, logs it with the
// client's name or address, and counts it.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, p *problem.Error) {
	s.logRefusal(r, p)
	s.countRefusal(r, p.Code)
	problem.Write(w, r, nil, p)
}

// forbidden is the 403 of a known client outside its permissions. It says
// nothing of the resource beyond what the client sent.
func forbidden(c *access.Client, what string) *problem.Error {
	return problem.New(http.StatusForbidden, "forbidden", "client "+c.Name+" may not "+what)
}

// RefusalLinesPerSecond bounds the refusal lines (401, 403, 429) the API
// logs, so that a flood of refused calls cannot flood the log: beyond it a
// refusal is only counted (MetricRefusals counts every one), and the next
// line logged says in its "suppressed" attribute how many were left out.
const RefusalLinesPerSecond = 20

// logRefusal logs a refusal at warn, within RefusalLinesPerSecond.
func (s *Server) logRefusal(r *http.Request, p *problem.Error) {
	ok, suppressed := s.refusalLines.Allow(time.Now())
	if !ok {
		return
	}
	attrs := []slog.Attr{
		slog.String("request_id", reqid.From(r)), slog.Int("status", p.Status), slog.String("code", p.Code),
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
	}
	if name := ClientName(r.Context()); name != "" {
		attrs = append(attrs, slog.String("client", name))
	} else {
		attrs = append(attrs, slog.String("client_addr", remoteHost(r)))
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("suppressed", suppressed))
	}
	s.log.LogAttrs(r.Context(), slog.LevelWarn, "lease API refusal", attrs...)
}

// countRefusal adds one to MetricRefusals.
func (s *Server) countRefusal(r *http.Request, code string) {
	if s.refusals == nil {
		return
	}
	name := ClientName(r.Context())
	if name == "" {
		name = noClient
	}
	s.refusals.Add(r.Context(), 1, metric.WithAttributes(attribute.String("client", name), attribute.String("code", code)))
}
