package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"
)

// demoUpstream is a tiny key-value HTTP service that records every write it
// applies, for the README's walkthrough and docker-compose: PUT, POST or
// PATCH a path to store the body there, DELETE to remove it, GET a path to
// read it back with the Fencing-Token it was written with, GET / to list
// everything. It knows nothing about fencing: the gate in front of it does.
type demoUpstream struct {
	mu    sync.Mutex
	items map[string]demoItem
	log   *slog.Logger
}

type demoItem struct {
	Path         string          `json:"path"`
	Body         json.RawMessage `json:"body,omitempty"`
	Text         string          `json:"text,omitempty"`
	FencingToken string          `json:"fencing_token"`
	Method       string          `json:"method"`
	WrittenAt    string          `json:"written_at"`
}

func (d *demoUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		d.mu.Lock()
		defer d.mu.Unlock()
		if r.URL.Path == "/" {
			list := make([]demoItem, 0, len(d.items))
			for _, it := range d.items {
				list = append(list, it)
			}
			sort.Slice(list, func(i, j int) bool { return list[i].Path < list[j].Path })
			_ = json.NewEncoder(w).Encode(map[string]any{"items": list})
			return
		}
		it, ok := d.items[r.URL.Path]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "not found"})
			return
		}
		_ = json.NewEncoder(w).Encode(it)
	case http.MethodDelete:
		d.mu.Lock()
		delete(d.items, r.URL.Path)
		d.mu.Unlock()
		d.log.Info("applied", "method", r.Method, "path", r.URL.Path, "fencing_token", r.Header.Get("Fencing-Token"))
		w.WriteHeader(http.StatusNoContent)
	default:
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		it := demoItem{Path: r.URL.Path, FencingToken: r.Header.Get("Fencing-Token"), Method: r.Method, WrittenAt: time.Now().UTC().Format(time.RFC3339Nano)}
		if json.Valid(body) {
			it.Body = body
		} else {
			it.Text = string(body)
		}
		d.mu.Lock()
		d.items[r.URL.Path] = it
		d.mu.Unlock()
		d.log.Info("applied", "method", r.Method, "path", r.URL.Path, "fencing_token", it.FencingToken)
		_ = json.NewEncoder(w).Encode(it)
	}
}

// runDemoUpstream serves the demo upstream on addr until ctx ends.
func runDemoUpstream(ctx context.Context, args []string, stderr io.Writer) error {
	addr := "127.0.0.1:9000"
	switch len(args) {
	case 0:
	case 1:
		addr = args[0]
	default:
		return errors.New("usage: fencegate demo-upstream [host:port]")
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("demo upstream: %w", err)
	}
	srv := &http.Server{Handler: &demoUpstream{items: map[string]demoItem{}, log: log}, ReadHeaderTimeout: 10 * time.Second}
	log.Info("demo upstream listening", "addr", ln.Addr().String())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
