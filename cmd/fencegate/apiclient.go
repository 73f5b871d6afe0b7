package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/internal/certs"
	"github.com/fencegate/fencegate/leaseapi"
)

// apiFlags are the client commands' --api-url and --api-token-file.
type apiFlags struct {
	url, tokenFile string
}

// register adds the flags to a command's flag set.
func (a *apiFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&a.url, "api-url", "", "the lease API's base URL (default: $FENCEGATE_API_URL, else "+config.DefaultAPIURL+")")
	fs.StringVar(&a.tokenFile, "api-token-file", "", "a file whose first line is the API token (default: $FENCEGATE_API_TOKEN)")
}

// apiURL is the lease API's base URL: --api-url, FENCEGATE_API_URL, or
// the default.
func (c *cli) apiURL() (string, error) {
	raw, from := c.api.url, "--api-url"
	if raw == "" {
		raw, from = c.getenv("FENCEGATE_API_URL"), "FENCEGATE_API_URL"
	}
	if raw == "" {
		return config.DefaultAPIURL, nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", withExit(exitUsage, fmt.Errorf("%s %q: want http://host:port or https://host:port", from, raw))
	}
	return raw, nil
}

// apiToken is the bearer token: the first line of --api-token-file, or
// FENCEGATE_API_TOKEN. A file keeps the secret out of the environment and
// the command line (a Kubernetes Secret mounted as a file).
func (c *cli) apiToken() (string, error) {
	if c.api.tokenFile == "" {
		tok := c.getenv("FENCEGATE_API_TOKEN")
		if err := config.ValidateAPIToken(tok); err != nil {
			// It could not be sent: say so, rather than fail the call as
			// if the API had not answered.
			return "", withExit(exitUsage, fmt.Errorf("FENCEGATE_API_TOKEN: %w (--api-token-file reads the first line of a file)", err))
		}
		return tok, nil
	}
	raw, err := os.ReadFile(c.api.tokenFile)
	if err != nil {
		return "", withExit(exitUsage, fmt.Errorf("--api-token-file: %w", err))
	}
	tok, _, _ := strings.Cut(string(raw), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", withExit(exitUsage, fmt.Errorf("--api-token-file %s: the first line is empty", c.api.tokenFile))
	}
	if err := config.ValidateAPIToken(tok); err != nil {
		return "", withExit(exitUsage, fmt.Errorf("--api-token-file %s: %w", c.api.tokenFile, err))
	}
	return tok, nil
}

// client is a lease API client configured from the flags and environment.
func (c *cli) client() (*leaseapi.Client, error) {
	base, err := c.apiURL()
	if err != nil {
		return nil, err
	}
	tok, err := c.apiToken()
	if err != nil {
		return nil, err
	}
	var opts []leaseapi.ClientOption
	if tok != "" {
		opts = append(opts, leaseapi.WithToken(tok))
	}
	tlsCfg, err := c.apiTLS()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, leaseapi.WithTLSConfig(tlsCfg))
	}
	return leaseapi.NewClient(base, opts...), nil
}

// apiTLS is the client TLS configuration from FENCEGATE_API_CA_FILE (a
// private CA for an https:// API) and FENCEGATE_API_CLIENT_CERT and
// FENCEGATE_API_CLIENT_KEY (a client certificate for a mutual-TLS API), or
// nil when none is set. A file that does not load is a usage error naming
// it.
func (c *cli) apiTLS() (*tls.Config, error) {
	files := certs.ClientFiles{
		CAFile:   c.getenv("FENCEGATE_API_CA_FILE"),
		CertFile: c.getenv("FENCEGATE_API_CLIENT_CERT"),
		KeyFile:  c.getenv("FENCEGATE_API_CLIENT_KEY"),
	}
	if files == (certs.ClientFiles{}) {
		return nil, nil
	}
	if (files.CertFile == "") != (files.KeyFile == "") {
		return nil, withExit(exitUsage, errors.New("FENCEGATE_API_CLIENT_CERT and FENCEGATE_API_CLIENT_KEY must be set together"))
	}
	cfg, err := certs.ClientConfig(files)
	if err != nil {
		return nil, withExit(exitUsage, fmt.Errorf("lease API TLS (FENCEGATE_API_CA_FILE, FENCEGATE_API_CLIENT_CERT, FENCEGATE_API_CLIENT_KEY): %w", err))
	}
	return cfg, nil
}

// callAPI sends one request and prints the answer: the JSON on stdout on
// success, the problem on stderr on refusal. wait is how long the server
// may legitimately take on top of a normal call. check, when not nil,
// reads a 2xx answer first: an answer it refuses (ErrBadAnswer: not the
// lease API's) is not printed, and exits 4.
func (c *cli) callAPI(cmd *cobra.Command, method, path string, query url.Values, body any, wait time.Duration, check func([]byte) error) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), wait+callTimeout)
	defer cancel()
	raw, err := client.Call(ctx, method, path, query, body)
	if err == nil && check != nil {
		err = check(raw)
	}
	if err != nil {
		return c.apiFailure(err)
	}
	return printJSONLine(c.stdout, raw)
}

// apiFailure reports a failed API call on stderr and chooses the exit
// status (see leaseHelp).
func (c *cli) apiFailure(err error) error {
	var pe *leaseapi.ProblemError
	if errors.As(err, &pe) && !pe.FromAPI() {
		base, _ := c.apiURL()
		answer := fmt.Sprintf("%d %s", pe.Status, http.StatusText(pe.Status))
		if pe.Detail != "" {
			answer += " (" + pe.Detail + ")"
		}
		if pe.Status == http.StatusBadRequest && strings.Contains(pe.Detail, "https://") {
			// The client's reading of a Go TLS server's answer to
			// cleartext: the API is there, the URL's scheme is wrong.
			return withExit(exitUsage, fmt.Errorf("%s answered %s", base, answer))
		}
		// Not a refusal: something else answered (a wrong URL, another
		// server, a proxy's error page), so nothing is known of the lease.
		return withExit(exitUnavailable, fmt.Errorf("%s answered %s without a problem document of fencegate's lease API: it does not look like the lease API (check --api-url or FENCEGATE_API_URL, and any proxy in front of the API)", base, answer))
	}
	if errors.As(err, &pe) {
		if pe.Body == nil || printJSONLine(c.stderr, pe.Body) != nil {
			fmt.Fprintln(c.stderr, pe.Error())
		}
		switch {
		case pe.Status >= http.StatusInternalServerError:
			return withExit(exitUnavailable, nil)
		case pe.Status == http.StatusBadRequest:
			return withExit(exitUsage, nil)
		default:
			return withExit(exitRefused, nil)
		}
	}
	if errors.Is(err, context.Canceled) {
		// Ctrl-C or SIGTERM (main's context): not the API's fault.
		return withExit(exitInterrupted, errors.New("interrupted (a call in flight may have taken effect)"))
	}
	if errors.Is(err, leaseapi.ErrBadAnswer) {
		base, _ := c.apiURL()
		return withExit(exitUnavailable, fmt.Errorf("%w (is %s fencegate's lease API? --api-url or FENCEGATE_API_URL names it)", err, base))
	}
	if errors.Is(err, leaseapi.ErrUnreachable) {
		base, _ := c.apiURL()
		var cause error = err
		if op := (*net.OpError)(nil); errors.As(err, &op) {
			cause = op
		}
		return withExit(exitUnavailable, fmt.Errorf("the lease API at %s is unreachable: %w (is fencegate serve running there? --api-url or FENCEGATE_API_URL names it)", base, cause))
	}
	if transient(err) {
		return withExit(exitUnavailable, err)
	}
	return err
}

// transient reports whether a failed call that got no problem answer may
// succeed if tried again: the server or its store could not answer, or the
// outcome is unknown (apiFailure handles problem answers first).
func transient(err error) bool {
	return errors.Is(err, fencing.ErrUnavailable) || errors.Is(err, fencing.ErrAmbiguous) || errors.Is(err, context.DeadlineExceeded)
}

// printJSONLine writes a JSON document on one line.
func printJSONLine(w io.Writer, raw []byte) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return fmt.Errorf("the API answered with malformed JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// completeResources offers the resources of live leases, asking the API
// with a short timeout; without an answer it offers nothing.
func (c *cli) completeResources(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	client, err := c.client()
	if err != nil || fencing.ValidateResourcePrefix(toComplete) != nil && toComplete != "" {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
	defer cancel()
	leases, err := client.List(ctx, toComplete, 0)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	out := make([]cobra.Completion, 0, len(leases))
	for _, l := range leases {
		out = append(out, l.Resource)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
