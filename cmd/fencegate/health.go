package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/fencegate/fencegate/config"
)

// health asks a running fencegate whether it is ready: GET /readyz on the
// lease API, exit 0 on a 2xx answer, 1 on anything else (not ready,
// draining, unreachable, timed out), 2 on bad flags. It is meant for
// container healthchecks on images without a shell or curl (distroless):
//
//	HEALTHCHECK CMD ["fencegate", "health"]
//
// The URL defaults to /readyz on FENCEGATE_API_ADDR, with a wildcard host
// (0.0.0.0, ::, empty) replaced by loopback. --url takes any URL, such as
// .../livez for a liveness check.
func health(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	// pflag, as cobra uses for every other command: one flag style
	// (--url, -h) across the binary.
	fs := pflag.NewFlagSet("health", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the URL to ask (default http://<FENCEGATE_API_ADDR>/readyz)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "Exit 0 when a running fencegate's /readyz answers ready, 1 otherwise.\n\nUsage:\n  fencegate health [--url URL] [--timeout 5s]\n\nFlags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	fs.Usage = func() {} // printed below: on stdout when asked for, like every command's help
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			usage(stdout)
			return nil
		}
		fmt.Fprintln(stderr, "fencegate health:", err)
		usage(stderr)
		return withExit(exitUsage, nil)
	}
	if fs.NArg() > 0 {
		return withExit(exitUsage, fmt.Errorf("health takes no arguments, got %q", fs.Args()))
	}
	if *timeout <= 0 {
		return withExit(exitUsage, errors.New("health: --timeout must be positive"))
	}
	target := *url
	if target == "" {
		target = "http://" + loopbackAddr(apiAddr(environ)) + "/readyz"
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return withExit(exitUsage, fmt.Errorf("health: --url: %w", err))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return withExit(exitFailure, fmt.Errorf("health: not ready: %w", err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return withExit(exitFailure, fmt.Errorf("health: not ready: %s answered %s: %s", target, resp.Status, strings.TrimSpace(string(body))))
	}
	_, err = fmt.Fprintln(stdout, "ready")
	return err
}

// apiAddr is FENCEGATE_API_ADDR from environ, or its default. The rest of
// the configuration is not read: a healthcheck must not fail because an
// unrelated variable is wrong.
func apiAddr(environ []string) string {
	const name = config.Prefix + "API_ADDR"
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, name+"="); ok && v != "" {
			return v
		}
	}
	for _, v := range config.Help() {
		if v.Name == name {
			return v.Default
		}
	}
	return ""
}

// loopbackAddr turns a listen address into one to dial: a wildcard host
// becomes the loopback address of its family.
func loopbackAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}
