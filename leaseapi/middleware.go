package leaseapi

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/fencegate/fencegate/fencing/problem"
	"github.com/fencegate/fencegate/fencing/reqid"
)

// noStore forbids caching: every answer describes lease state at one
// instant.
func noStore(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// recoverer turns a handler panic into a 500 problem and logs it with the
// stack and request id. http.ErrAbortHandler is re-raised: it is net/http's
// way to abort a response on purpose.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.LogAttrs(r.Context(), slog.LevelError, "handler panic",
				slog.String("request_id", reqid.From(r)),
				slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
			problem.Write(w, r, nil, problem.New(http.StatusInternalServerError, "internal-error", "internal error"))
		}()
		next.ServeHTTP(w, r)
	})
}

// bearer extracts the credentials of a Bearer Authorization header.
func bearer(h string) (string, bool) {
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	cred = strings.TrimLeft(cred, " ")
	return cred, cred != ""
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	s.answerRouting(w, r, problem.New(http.StatusNotFound, "not-found", "no such endpoint: "+r.Method+" "+r.URL.Path))
}

// answerRouting writes a 404 or 405 of the router, counted as a refusal
// (MetricRefusals) when it answers a /v1 call: an authenticated client
// probing paths shows there as it does in the access log's 403s.
func (s *Server) answerRouting(w http.ResponseWriter, r *http.Request, p *problem.Error) {
	if r.URL.Path == "/v1" || strings.HasPrefix(r.URL.Path, "/v1/") {
		s.countRefusal(r, p.Code)
	}
	problem.Write(w, r, nil, p)
}

// allowCandidates are the methods probed to build the Allow header of a 405.
var allowCandidates = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// methodNotAllowed answers 405 with the Allow header listing the methods the
// path does accept (chi's own 405 handler sets Allow, a custom one must
// find the methods itself).
func (s *Server) methodNotAllowed(mux *chi.Mux) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		var allow []string
		hasGet := false
		for _, m := range allowCandidates {
			if m == http.MethodHead {
				continue // added with GET below: GetHead serves HEAD as GET
			}
			if mux.Match(chi.NewRouteContext(), m, path) {
				allow = append(allow, m)
				hasGet = hasGet || m == http.MethodGet
			}
		}
		if hasGet {
			allow = append(allow, http.MethodHead)
		}
		p := problem.New(http.StatusMethodNotAllowed, "method-not-allowed",
			fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, strings.Join(allow, ", ")))
		p.Headers = http.Header{"Allow": {strings.Join(allow, ", ")}}
		s.answerRouting(w, r, p)
	}
}
