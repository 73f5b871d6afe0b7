package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/fencing"
)

// sharedBarrier returns the store's shared barrier and this gate's id when
// FENCEGATE_BARRIER=shared, or nil for the local barrier. It looks through
// decorators (storemetrics): fencing.CapabilitiesOf reports the concrete
// store's shared barrier.
func sharedBarrier(cfg config.Config, store fencing.Store, log *slog.Logger) (fencing.SharedBarrier, string, error) {
	if cfg.Barrier != config.BarrierShared {
		return nil, "", nil
	}
	sb := fencing.CapabilitiesOf(store).Shared
	if sb == nil {
		return nil, "", fmt.Errorf("FENCEGATE_BARRIER=shared: the %s store has no shared barrier", storeKind(cfg.Store))
	}
	if c, ok := sb.(interface{ SharedBarrierSupported() error }); ok {
		if err := c.SharedBarrierSupported(); err != nil {
			return nil, "", fmt.Errorf("FENCEGATE_BARRIER=shared: %w", err)
		}
	}
	id := cfg.GateID
	if id == "" {
		id = defaultGateID()
	}
	log.Info("shared barrier: writes are ordered across every gate on the store", "gate_id", id)
	return sb, id, nil
}

// defaultGateID is the host name and the process id, reduced to the
// characters a gate id allows. It only labels entries: correctness never
// depends on it (a restarted gate's old entries expire at their deadline).
func defaultGateID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '.' || r == '_' || r == '-' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return r
		}
		return '_'
	}, host)
	if len(host) > 80 {
		host = host[:80]
	}
	if host == "" {
		host = "gate"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// storeKind is the scheme of a store URL (file, memory, valkey, ...),
// which names the store without its credentials.
func storeKind(url string) string {
	kind, _, _ := strings.Cut(url, ":")
	return kind
}
