// Command worker is an example fencegate worker in Go. It campaigns for the
// lease on a resource (leaseapi.Campaign) and, while it leads, writes one
// step at a time to a service through fencegate's write gate, with an
// http.Client whose transport is the session's (Session.Transport): every
// write carries the session's Fencing-Token, and none leaves once the lease
// is lost. After each write it saves its progress with a checkpoint, which
// also renews the lease; a new leader resumes from the last checkpoint.
//
// Usage:
//
//	worker [-api URL] [-gate URL] [-resource job:ID] [-path /jobs/{id}] [-owner O] [-ttl 30s] [-interval 1s] [-steps N]
//
// The API URL defaults to $FENCEGATE_API_URL, else http://127.0.0.1:7070;
// $FENCEGATE_API_TOKEN is sent when set. For an https:// API,
// $FENCEGATE_API_CA_FILE names a private CA and $FENCEGATE_API_CLIENT_CERT
// and $FENCEGATE_API_CLIENT_KEY a client certificate for a mutual-TLS API
// (which, with an access file naming it, needs no token). The gate URL defaults to
// $GATE_URL, else http://127.0.0.1:8080. Each write is PUT <gate><path>
// with a JSON body, where {id} in -path is the resource's part after its
// first ':' (job:44 writes /jobs/44): the gate of the README's quick start
// (rule "PUT,PATCH,DELETE /jobs/{id} fence job:{id}") fences it on the
// resource itself. The session's transport also sends Fencing-Resource, for
// a gate without rules. The worker prints one JSON line per event on
// stdout: lead, write, refused (with the problem's code), stop, step-down,
// done, and retry when an acquisition fails for another reason than a
// held lease (the lease API unreachable, say: the campaign tries again
// every second). With -steps N it releases the lease as finished after
// step N-1 and exits 0; otherwise it runs until SIGINT or SIGTERM, then
// releases the lease and exits 0.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// progress is the checkpoint state: the next step to write.
type progress struct {
	Next int `json:"next"`
}

// events prints one JSON object per line.
type events struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (e *events) emit(fields map[string]any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fields["time"] = time.Now().UTC().Format(time.RFC3339Nano)
	_ = e.enc.Encode(fields)
}

// errFenced: the gate refused a write; the lease is gone.
var errFenced = errors.New("write refused by the gate")

// errRejected: the gate answered a write with a client error other than a
// fencing refusal (a path no rule fences, a malformed request): running
// another term would not help, so the worker stops and exits 1.
var errRejected = errors.New("write rejected by the gate")

// errFinished ends the campaign once every step is written.
var errFinished = errors.New("finished")

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	apiURL := os.Getenv("FENCEGATE_API_URL")
	if apiURL == "" {
		apiURL = "http://127.0.0.1:7070"
	}
	api := fs.String("api", apiURL, "lease API base URL")
	gateURL := os.Getenv("GATE_URL") // as the shell example reads it
	if gateURL == "" {
		gateURL = "http://127.0.0.1:8080"
	}
	gate := fs.String("gate", gateURL, "write gate base URL ($GATE_URL when set)")
	resource := fs.String("resource", "job:demo", "resource to lead")
	path := fs.String("path", "/jobs/{id}", "path of the writes; {id} is the resource after its first ':'")
	owner := fs.String("owner", leaseapi.DefaultOwner(), "owner name")
	ttl := fs.Duration("ttl", 30*time.Second, "lease TTL (whole seconds)")
	interval := fs.Duration("interval", time.Second, "pause between writes")
	steps := fs.Int("steps", 0, "steps to write before finishing (0: until stopped)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var opts []leaseapi.ClientOption
	if tok := os.Getenv("FENCEGATE_API_TOKEN"); tok != "" {
		opts = append(opts, leaseapi.WithToken(tok))
	}
	tlsCfg, err := apiTLS()
	if err != nil {
		return err
	}
	if tlsCfg != nil {
		opts = append(opts, leaseapi.WithTLSConfig(tlsCfg))
	}
	client := leaseapi.NewClient(*api, opts...)
	ev := &events{enc: json.NewEncoder(stdout)}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	election := leaseapi.ElectionOptions{
		Session: leaseapi.SessionOptions{Owner: *owner, TTL: *ttl},
		OnStepDown: func(l fencing.Lease, err error) {
			why := ""
			if err != nil {
				why = err.Error()
			}
			ev.emit(map[string]any{"event": "step-down", "owner": *owner, "token": l.Token, "why": why})
		},
		OnAcquireError: func(err error) {
			ev.emit(map[string]any{"event": "retry", "owner": *owner, "what": "acquire", "error": err.Error()})
		},
	}
	err = leaseapi.Campaign(ctx, client, *resource, election, func(ctx context.Context, s *leaseapi.Session) error {
		target := *gate + expandPath(*path, s.Resource())
		err := lead(ctx, client, s, target, *interval, *steps, ev)
		if errors.Is(err, errFinished) {
			// Release with a context of its own: ctx is the term's, and
			// Release ends the term, which cancels ctx before the call
			// is made (the release would then never reach the server,
			// and the campaign would run another term, forever).
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer rcancel()
			if _, rerr := s.Release(rctx, true); rerr != nil {
				return rerr
			}
			cancel(errFinished)
		}
		if errors.Is(err, errRejected) {
			cancel(err)
		}
		return err
	})
	if cause := context.Cause(ctx); errors.Is(cause, errRejected) {
		return cause
	}
	if errors.Is(context.Cause(ctx), errFinished) {
		ev.emit(map[string]any{"event": "done", "owner": *owner})
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return nil // stopped by a signal; the lease was released
	}
	return err
}

// lead does the work while s holds the lease, and returns when ctx is
// cancelled (lease lost, or the worker is stopping), when the gate refuses
// a write, or with errFinished after the last step.
func lead(ctx context.Context, client *leaseapi.Client, s *leaseapi.Session, target string, interval time.Duration, steps int, ev *events) error {
	tok := s.Token()
	ev.emit(map[string]any{"event": "lead", "owner": s.Owner(), "token": tok})
	defer ev.emit(map[string]any{"event": "stop", "owner": s.Owner(), "token": tok})

	var p progress
	cp, err := client.ReadCheckpoint(ctx, s.Resource())
	switch {
	case err == nil:
		if err := json.Unmarshal(cp.State, &p); err != nil {
			return fmt.Errorf("checkpoint state: %w", err)
		}
	case !errors.Is(err, fencing.ErrNoCheckpoint):
		return err
	}

	hc := &http.Client{Transport: s.Transport(nil), Timeout: 10 * time.Second}
	for step := p.Next; steps == 0 || step < steps; step++ {
		body, _ := json.Marshal(map[string]any{"owner": s.Owner(), "token": tok, "step": step})
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		switch {
		case errors.Is(err, leaseapi.ErrWriteRefused):
			ev.emit(map[string]any{"event": "refused", "by": "session", "owner": s.Owner(), "token": tok, "step": step})
			return nil // the session ended: Campaign steps down
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return err
		}
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode == http.StatusConflict {
			ev.emit(map[string]any{"event": "refused", "by": "gate", "owner": s.Owner(), "token": tok, "step": step, "status": resp.StatusCode, "code": problemCode(answer)})
			return errFenced
		}
		if resp.StatusCode/100 != 2 {
			ev.emit(map[string]any{"event": "error", "owner": s.Owner(), "token": tok, "step": step, "status": resp.StatusCode, "code": problemCode(answer)})
			if resp.StatusCode/100 == 4 {
				return fmt.Errorf("%w: step %d: %s %s", errRejected, step, resp.Status, problemCode(answer))
			}
			return fmt.Errorf("write %d: %s %s", step, resp.Status, problemCode(answer))
		}
		ev.emit(map[string]any{"event": "write", "owner": s.Owner(), "token": tok, "step": step})
		if _, err := s.Checkpoint(ctx, progress{Next: step + 1}); err != nil {
			if ctx.Err() != nil || errors.Is(err, leaseapi.ErrSessionLost) || errors.Is(err, fencing.ErrLeaseLost) {
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
	return errFinished
}

// apiTLS is the TLS configuration for an https:// lease API from
// FENCEGATE_API_CA_FILE, FENCEGATE_API_CLIENT_CERT and
// FENCEGATE_API_CLIENT_KEY, or nil when none is set.
func apiTLS() (*tls.Config, error) {
	ca, cert, key := os.Getenv("FENCEGATE_API_CA_FILE"), os.Getenv("FENCEGATE_API_CLIENT_CERT"), os.Getenv("FENCEGATE_API_CLIENT_KEY")
	if ca == "" && cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("FENCEGATE_API_CA_FILE %s holds no PEM certificate", ca)
		}
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("FENCEGATE_API_CLIENT_CERT/KEY: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// expandPath fills {id} in a path template with the resource's part after
// its first ':' (the whole resource when it has none).
func expandPath(tmpl, resource string) string {
	_, id, ok := strings.Cut(resource, ":")
	if !ok {
		id = resource
	}
	return strings.ReplaceAll(tmpl, "{id}", url.PathEscape(id))
}

// problemCode is the code of an application/problem+json answer ("" when
// the answer is not one): what a refused write prints, so the reason is
// plain (stale-token, resource-required, ...).
func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}
