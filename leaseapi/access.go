package leaseapi

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/fencegate/fencegate/fencing/reqid"
)

// AccessMessage is the message of the access log's lines (Options.AccessLog):
// one per lease API call, at info, when its answer is sent, with
// request_id, client (the peer's address), method, path, status and
// duration_ms. Health checks and /metrics are not logged: a probe every
// few seconds would drown the calls.
const AccessMessage = "api request"

// logAccess logs each call's access line.
func (s *Server) logAccess(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/livez", "/readyz", "/metrics":
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		defer func() {
			status := ww.Status()
			if status == 0 {
				status = http.StatusOK // nothing written: net/http sends 200
			}
			path := r.URL.Path
			if len(path) > 256 {
				path = path[:256]
			}
			ms := float64(time.Since(start).Microseconds()) / 1000
			s.log.LogAttrs(r.Context(), slog.LevelInfo, AccessMessage,
				slog.String("request_id", reqid.From(r)), slog.String("client", r.RemoteAddr),
				slog.String("method", r.Method), slog.String("path", path),
				slog.Int("status", status), slog.Float64("duration_ms", ms))
		}()
		next.ServeHTTP(ww, r)
	})
}
