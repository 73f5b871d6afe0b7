package leaseapi

import (
	_ "embed"
	"net/http"
)

// openAPIDocument is the OpenAPI 3.1 description of the API listener,
// kept in openapi.json beside this file. A test validates the real
// handlers' answers against it and checks that it lists exactly the routes
// in routes.go, so the two cannot drift apart unnoticed.
//
//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns the OpenAPI 3.1 document (JSON) of the lease API, as
// served at GET /openapi.json.
func OpenAPI() []byte { return append([]byte(nil), openAPIDocument...) }

func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(openAPIDocument)
}
