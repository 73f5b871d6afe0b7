package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/internal/certs"
)

// listenerTLS loads a listener's TLS files (FENCEGATE_<name>_CERT, _KEY,
// _CLIENT_CA), registers their reload on SIGHUP, and, when watch is
// positive, re-reads them whenever they change on disk until ctx ends. It
// returns nil when cert is empty (a cleartext listener). A file that does
// not load is a start-up error naming it; at a reload it is logged and the
// pair in force stays.
func listenerTLS(ctx context.Context, name, cert, key, clientCA string, watch time.Duration, reg *reloads, log *slog.Logger) (*certs.Source, error) {
	if cert == "" {
		return nil, nil
	}
	src, err := certs.New(certs.Files{CertFile: cert, KeyFile: key, ClientCAFile: clientCA})
	if err != nil {
		return nil, fmt.Errorf("%s%s_CERT: %w", config.Prefix, name, err)
	}
	what := config.Prefix + name + "_CERT " + cert
	reg.add(what, src.Reload)
	if watch > 0 {
		go src.Watch(ctx, watch, func(err error) {
			if err != nil {
				log.Error("TLS files changed on disk but do not load: the certificate in force stays", "what", what, "error", err.Error())
				return
			}
			log.Info("TLS files changed on disk: reloaded", "what", what)
		})
	}
	return src, nil
}
