package leaseapi

import (
	"github.com/go-chi/chi/v5"

	"github.com/fencegate/fencegate/leaseapi/access"
)

// Routes exposes the API's router to the tests, to walk its routes.
func Routes(s *Server) chi.Routes { return s.routes() }

// SetLimiter replaces the server's failed-authentication limiter (to give
// it a fake clock).
func SetLimiter(s *Server, l *access.Limiter) { s.limiter = l }

// Waiting returns how many acquisitions wait on resource in s's queue.
func Waiting(s *Server, resource string) int { return s.waiters.waiting(resource) }

// BodiesHeld returns the request body bytes s holds now (bodybudget.go).
func BodiesHeld(s *Server) int64 { return s.bodies.held() }

// BodyBudget returns s's body budget for large bodies (above the small
// calls' reserve): in all, and per client address.
func BodyBudget(s *Server) (total, perClient int64) {
	return s.bodies.total - s.bodies.reserve, s.bodies.perClient - s.bodies.clientReserve
}
