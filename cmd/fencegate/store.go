package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/boltstore"
	"github.com/fencegate/fencegate/fencing/memstore"
	"github.com/fencegate/fencegate/fencing/pgstore"
	"github.com/fencegate/fencegate/fencing/valkeystore"
	"github.com/fencegate/fencegate/internal/certs"
)

// openStore opens the configured store. environ is the injected
// environment: the postgres store takes PGPASSWORD from it.
func openStore(ctx context.Context, cfg config.Config, environ []string, log *slog.Logger) (fencing.Store, error) {
	spec, err := config.ParseStore(cfg.Store)
	if err != nil {
		return nil, err
	}
	switch spec.Kind {
	case config.StoreMemory:
		log.Warn("memory store: leases, checkpoints and high-water marks are forgotten when fencegate stops (tokens follow the host clock, so they are not issued again unless the clock steps back). Use it for tests and demos only.")
		// Tokens on the clock, as in every store (DESIGN §12): a token
		// issued before a record was removed by retention stays refused.
		s := memstore.New(memstore.Options{MaxCheckpointBytes: cfg.MaxCheckpointBytes, Retention: cfg.Retention, ClockTokens: true})
		log.Info("store open", "store", spec.Redacted())
		return s, nil
	case config.StoreFile:
		s, err := boltstore.Open(spec.Path, boltstore.Options{MaxCheckpointBytes: cfg.MaxCheckpointBytes, Logger: log, Retention: cfg.Retention})
		if err != nil {
			return nil, fmt.Errorf("opening the file store: %w", err)
		}
		log.Info("store open", "store", spec.Redacted())
		return s, nil
	case config.StoreValkey:
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		tlsConfig, err := valkeyTLS(cfg.ValkeyCAFile)
		if err != nil {
			return nil, err
		}
		s, err := valkeystore.Open(ctx, valkeystore.Options{
			URL:                spec.URL,
			KeyPrefix:          cfg.KeyPrefix,
			MaxCheckpointBytes: cfg.MaxCheckpointBytes,
			Logger:             log,
			DialTimeout:        cfg.ValkeyDialTimeout,
			CommandTimeout:     cfg.ValkeyCommandTimeout,
			TLSConfig:          tlsConfig,
			WaitReplicas:       cfg.ValkeyWaitReplicas,
			WaitTimeout:        cfg.ValkeyWaitTimeout,
			Retention:          cfg.Retention,
		})
		if err != nil {
			return nil, fmt.Errorf("opening the valkey store %s: %w", spec.Redacted(), err)
		}
		log.Info("store open", "store", spec.Redacted())
		return s, nil
	case config.StorePostgres:
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s, err := pgstore.Open(ctx, pgstore.Options{
			URL:                spec.URL,
			Password:           envValue(environ, "PGPASSWORD"),
			Schema:             cfg.PGSchema,
			StatementTimeout:   cfg.PGStatementTimeout,
			MaxCheckpointBytes: cfg.MaxCheckpointBytes,
			Logger:             log,
			Retention:          cfg.Retention,
		})
		if err != nil {
			return nil, fmt.Errorf("opening the postgres store %s: %w", spec.Redacted(), err)
		}
		log.Info("store open", "store", spec.Redacted(), "server_version", s.ServerVersion(), "schema", s.Schema())
		return s, nil
	}
	return nil, fmt.Errorf("store kind %q not supported", spec.Kind)
}

// valkeyTLS builds the TLS settings for valkeys:// from a CA file; nil (the
// system roots) when caFile is empty.
func valkeyTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pool, err := certs.LoadPool(caFile)
	if err != nil {
		return nil, fmt.Errorf("FENCEGATE_VALKEY_CA_FILE: %w", err)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
