package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegate/fencegate/internal/hangup"
)

// reloads is what SIGHUP re-reads: a list of named reload functions, run
// in the order they were added. A function that fails keeps what it had in
// force (each one's contract) and is logged with its name; the others
// still run. SIGHUP never stops the process.
//
// To make one more file reloadable, add it where it is first loaded:
//
//	reg.add("FENCEGATE_RULES_FILE "+cfg.RulesFile, func() error { ... })
type reloads struct {
	log     *slog.Logger
	mu      sync.Mutex // serialises reload runs and additions
	items   []reloadItem
	running atomic.Pointer[string] // the name of the item reloading now, nil between items
}

// reloadStopWait is the longest the reload loop's stop waits for a reload
// that is running when the process stops. A reload reads a few small files
// in far less; one that takes longer is blocked (a file on a hung network
// mount), and waiting for it would keep the drained process from exiting
// for ever.
const reloadStopWait = 2 * time.Second

type reloadItem struct {
	name   string // what is reloaded, with its file: the log line names it
	reload func() error
}

// add registers reload under name (such as "FENCEGATE_API_TLS_CERT
// /etc/tls/api.crt").
func (r *reloads) add(name string, reload func() error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, reloadItem{name, reload})
}

// reload runs every registered function once and returns how many failed.
func (r *reloads) reload(ctx context.Context) (failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log.InfoContext(ctx, "SIGHUP: reloading", "items", len(r.items))
	defer r.running.Store(nil)
	for _, it := range r.items {
		r.running.Store(&it.name)
		if err := it.reload(); err != nil {
			failed++
			r.log.ErrorContext(ctx, "reload refused: the configuration in force stays", "what", it.name, "error", err.Error())
			continue
		}
		r.log.InfoContext(ctx, "reloaded", "what", it.name)
	}
	return failed
}

// notifyReload subscribes ch to the reload signal, taking over from
// internal/hangup, which held it since the process started (a SIGHUP it
// held is passed on to ch); tests replace it.
var notifyReload = func(ch chan<- os.Signal) func() {
	hangup.Handover(ch)
	return func() { signal.Stop(ch) }
}

// run reloads r at each signal on ch until ctx ends or stop is called.
// The caller subscribes ch (notifyReload) as early as it can, so a SIGHUP
// during start-up waits in ch instead of taking the default action
// (ending the process).
//
// stop ends the loop: no reload starts after it. It waits up to wait for
// a reload that is running to finish, and reports whether none was left;
// one still running then is logged, with the item it is stuck in, and
// left behind: the process is exiting, and a reload blocked reading a
// file must not keep it from exiting (what it would change ends with it).
func (r *reloads) run(ctx context.Context, ch <-chan os.Signal) (stop func(wait time.Duration) bool) {
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				if ctx.Err() != nil { // both were ready: stop wins
					return
				}
				r.reload(ctx)
			}
		}
	}()
	return func(wait time.Duration) bool {
		cancel()
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-done:
			return true
		case <-t.C:
		}
		what := "?"
		if name := r.running.Load(); name != nil {
			what = *name
		}
		r.log.Warn("a reload is still running (blocked reading a file?); stopping without it", "what", what, "waited", wait.String())
		return false
	}
}
