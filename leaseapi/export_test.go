package leaseapi

import "github.com/go-chi/chi/v5"

// Routes exposes the API's router to the tests, to walk its routes.
func Routes(s *Server) chi.Routes { return s.routes() }
