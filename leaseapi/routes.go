package leaseapi

import (
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/fencegate/fencegate/fencing/reqid"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// routes lists every endpoint of the API listener. Middleware order, outer
// to inner: the route tag for telemetry (when on; it acts after routing),
// request id (so every later log line and problem carries it),
// no-store, panic recovery, HEAD-as-GET; authentication applies to /v1 only,
// before routing within it, so unauthenticated callers learn nothing about
// /v1 paths.
func (s *Server) routes() *chi.Mux {
	r := chi.NewRouter()
	if s.telemetry {
		r.Use(tagRoute)
	}
	r.Use(reqid.Middleware)
	if s.accessLog {
		r.Use(s.logAccess)
	}
	r.Use(noStore, s.recoverer, middleware.GetHead)
	r.NotFound(s.notFound)
	r.MethodNotAllowed(s.methodNotAllowed(r))

	r.Get("/livez", s.handleLivez)
	r.Get("/readyz", s.handleReadyz)
	r.Get("/openapi.json", s.handleOpenAPI)
	if s.metrics != nil {
		r.Method("GET", "/metrics", s.metrics)
	}

	r.Route("/v1", func(r chi.Router) {
		r.Use(s.authenticate)
		r.Get("/leases", s.handleList)
		r.Get("/leases/{resource}", s.onResource(access.Read, s.handleStatus))
		r.Post("/leases/{resource}/acquire", s.onResource(access.Acquire, s.handleAcquire))
		r.Post("/leases/{resource}/renew", s.onResource(access.Renew, s.handleRenew))
		r.Post("/leases/{resource}/release", s.onResource(access.Release, s.handleRelease))
		r.Put("/leases/{resource}/checkpoint", s.onResource(access.Checkpoint, s.handleCheckpoint))
		r.Get("/leases/{resource}/checkpoint", s.onResource(access.Read, s.handleReadCheckpoint))
	})
	return r
}
