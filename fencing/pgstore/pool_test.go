package pgstore

import (
	"runtime"
	"testing"
)

// TestPoolSizeDefault: without pool_max_conns the pool holds at least
// DefaultMaxConns connections (pgxpool alone would give max(4, CPUs), which
// serializes concurrent operations on a small machine); a URL that sets it
// is obeyed, smaller or larger.
func TestPoolSizeDefault(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want int32
	}{
		{"postgres://u@db/fg", max(DefaultMaxConns, int32(runtime.NumCPU()))},
		{"postgres://u@db/fg?pool_max_conns=3", 3},
		{"postgresql://u@db/fg?sslmode=disable&pool_max_conns=64", 64},
	} {
		cfg, err := poolConfig(Options{URL: tc.url})
		if err != nil {
			t.Fatalf("poolConfig(%s): %v", tc.url, err)
		}
		if cfg.MaxConns != tc.want {
			t.Errorf("poolConfig(%s).MaxConns = %d, want %d", tc.url, cfg.MaxConns, tc.want)
		}
	}
}
