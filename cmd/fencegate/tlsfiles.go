package main

import (
	"context"
	"errors"
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
		return nil, tlsFilesError(name, err)
	}
	what := config.Prefix + name + "_CERT " + cert
	reg.add(what, func() error { return tlsFilesError(name, src.Reload()) })
	if watch > 0 {
		go src.Watch(ctx, watch, func(err error) {
			if err != nil {
				log.Error("TLS files changed on disk but do not load: the certificate in force stays", "what", what, "error", tlsFilesError(name, err).Error())
				return
			}
			log.Info("TLS files changed on disk: reloaded", "what", what)
		})
	}
	return src, nil
}

// tlsFilesError labels an error of a listener's TLS files (certs.New,
// Reload) with the variables that name the files at fault:
// FENCEGATE_<name>_CLIENT_CA for the client CA bundle, else both
// FENCEGATE_<name>_CERT and FENCEGATE_<name>_KEY (the certificate and key
// pair: either file may be the wrong one, and the error names both
// files). nil stays nil.
func tlsFilesError(name string, err error) error {
	if err == nil {
		return nil
	}
	if errors.As(err, new(*certs.ClientCAError)) {
		return fmt.Errorf("%s%s_CLIENT_CA: %w", config.Prefix, name, err)
	}
	return fmt.Errorf("%[1]s%[2]s_CERT and %[1]s%[2]s_KEY: %[3]w", config.Prefix, name, err)
}
