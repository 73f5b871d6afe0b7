package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/internal/certs"
)

// health asks a running fencegate whether it is ready: GET /readyz on the
// lease API, exit 0 on a 2xx answer, 1 on anything else (not ready,
// draining, unreachable, timed out), 2 on bad flags. It is meant for
// container healthchecks on images without a shell or curl (distroless):
//
//	HEALTHCHECK CMD ["fencegate", "health"]
//
// The URL defaults to /readyz on FENCEGATE_API_ADDR, with a wildcard host
// (0.0.0.0, ::, empty) replaced by loopback, over https when
// FENCEGATE_API_TLS_CERT is set. --url takes any URL, such as .../livez for
// a liveness check. Over https the server is verified by
// FENCEGATE_API_CA_FILE when set; otherwise, with FENCEGATE_API_TLS_CERT
// readable, by being the very certificate in that file (the healthcheck
// runs beside the server, whose certificate may not name the loopback
// address); otherwise by the system roots. A mutual-TLS API needs
// FENCEGATE_API_CLIENT_CERT and FENCEGATE_API_CLIENT_KEY.
//
// --wait D keeps asking, every healthRetry, until the answer is ready or D
// has passed (each attempt bounded by --timeout and by what is left of
// D), and fails with the last attempt's reason (an attempt that the end
// of D cut short does not hide the answer before it): the one line a script
// needs after starting fencegate in the background, in place of a loop
// of its own that goes on silently when the server never comes up.
func health(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	// pflag, as cobra uses for every other command: one flag style
	// (--url, -h) across the binary.
	fs := pflag.NewFlagSet("health", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the URL to ask (default http://<FENCEGATE_API_ADDR>/readyz)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	wait := fs.Duration("wait", 0, "ask again until ready, for up to this long (0: ask once)")
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "Exit 0 when a running fencegate's /readyz answers ready, 1 otherwise.\n\nUsage:\n  fencegate health [--url URL] [--timeout 5s] [--wait 10s]\n\nFlags:")
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
	if *wait < 0 {
		return withExit(exitUsage, errors.New("health: --wait must not be negative"))
	}
	target := *url
	if target == "" {
		scheme := "http://"
		if envValue(environ, "FENCEGATE_API_TLS_CERT") != "" {
			scheme = "https://"
		}
		target = scheme + loopbackAddr(apiAddr(environ)) + "/readyz"
	}
	client, err := healthClient(environ)
	if err != nil {
		return withExit(exitUsage, fmt.Errorf("health: %w", err))
	}
	if _, err := http.NewRequest(http.MethodGet, target, nil); err != nil {
		return withExit(exitUsage, fmt.Errorf("health: --url: %w", err))
	}
	deadline := time.Now().Add(*wait)
	var reason error // why the server is not ready, as the attempts tell
	for {
		limit := *timeout
		if *wait > 0 {
			limit = min(limit, max(time.Until(deadline), time.Millisecond))
		}
		err := askReady(ctx, client, target, limit)
		if err == nil {
			_, err = fmt.Fprintln(stdout, "ready")
			return err
		}
		if cutShort := limit < *timeout && errors.Is(err, context.DeadlineExceeded); reason == nil || !cutShort {
			reason = err
		}
		pause := min(healthRetry, time.Until(deadline))
		if pause <= 0 || ctx.Err() != nil {
			return withExit(exitFailure, fmt.Errorf("health: not ready: %w", reason))
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return withExit(exitFailure, fmt.Errorf("health: not ready: %w", reason))
		}
	}
}

// healthRetry is the pause between the attempts of health --wait.
var healthRetry = 200 * time.Millisecond

// askReady sends one GET to target, bounded by timeout, and says why the
// answer is not ready (nil when it is: a 2xx).
func askReady(ctx context.Context, client *http.Client, target string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s answered %s: %s", target, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
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

// healthClient is the HTTP client of the health check, with the TLS
// settings its doc describes.
func healthClient(environ []string) (*http.Client, error) {
	files := certs.ClientFiles{
		CAFile:   envValue(environ, "FENCEGATE_API_CA_FILE"),
		CertFile: envValue(environ, "FENCEGATE_API_CLIENT_CERT"),
		KeyFile:  envValue(environ, "FENCEGATE_API_CLIENT_KEY"),
	}
	cfg, err := certs.ClientConfig(files)
	if err != nil {
		return nil, err
	}
	if files.CAFile == "" {
		if pin := pinnedLeaf(envValue(environ, "FENCEGATE_API_TLS_CERT")); pin != nil {
			cfg.InsecureSkipVerify = true // replaced by the pin below
			cfg.VerifyConnection = func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, pin) {
					return errors.New("the server's certificate is not the one in FENCEGATE_API_TLS_CERT (set FENCEGATE_API_CA_FILE to verify it by its CA)")
				}
				return nil
			}
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr}, nil
}

// pinnedLeaf is the DER of the first certificate in the PEM file, or nil.
func pinnedLeaf(file string) []byte {
	if file == "" {
		return nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil
	}
	return block.Bytes
}
