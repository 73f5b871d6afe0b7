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
