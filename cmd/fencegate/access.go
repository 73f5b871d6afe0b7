package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/internal/apitoken"
	"github.com/fencegate/fencegate/leaseapi/access"
)

func newAccessCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "access",
		Short: "Tools for the lease API's access file (FENCEGATE_ACCESS_FILE)",
		Long: `Tools for the lease API's access file (FENCEGATE_ACCESS_FILE): who may do
what, by resource prefix (see docs/access.md). 'fencegate check' validates
the file.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "access needs a command: hash or token")
			}
			return usageError(cmd, "unknown access command %q", args[0])
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "hash [TOKEN]",
		Short: "Print the token_sha256 of a bearer token (read from stdin when not given)",
		Long: `Print the hex SHA-256 of a bearer token, for a client's token_sha256 in the
access file; the file never holds the token itself. Without an argument
the token is read from the first line of stdin, which keeps it out of the
process list and the shell history:

  fencegate access hash < /run/secrets/pool-a-token`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tok := ""
			if len(args) == 1 {
				tok = args[0]
			} else {
				line, err := bufio.NewReader(io.LimitReader(c.stdin, 64<<10)).ReadString('\n')
				if err != nil && !errors.Is(err, io.EOF) {
					return err
				}
				tok = strings.TrimRight(line, "\r\n")
			}
			if tok == "" {
				return usageError(cmd, "no token: give it as the argument or on stdin")
			}
			if err := checkTokenChars(tok); err != nil {
				return usageError(cmd, "%v", err)
			}
			_, err := fmt.Fprintln(c.stdout, access.HashToken(tok))
			return err
		},
	}, newAccessTokenCmd(c))
	return cmd
}

// newAccessTokenCmd is 'fencegate access token': a new random bearer token
// and its token_sha256, each on a line that names it ("token: …",
// "token_sha256: …"; the second line can be pasted into the access file as
// it is), or with --output json both as one JSON object for scripts.
func newAccessTokenCmd(c *cli) *cobra.Command {
	output := "text"
	cmd := &cobra.Command{
		Use:   "token [--output text|json]",
		Short: "Make a new random bearer token and print it with its token_sha256",
		Long: `Make a new random bearer token (256 bits, URL-safe base64) and print it
with its token_sha256, each on a line that says what it is:

  token: <the token: give it to the client, as FENCEGATE_API_TOKEN or Authorization: Bearer>
  token_sha256: <its hash: this line goes into the client's entry in the access file>

With --output json, one JSON object for scripts:

  {"token":"...","token_sha256":"..."}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return usageError(cmd, "--output %q: want text or json", output)
			}
			b := make([]byte, 32)
			_, _ = rand.Read(b) // never fails (crypto/rand)
			tok := base64.RawURLEncoding.EncodeToString(b)
			if output == "json" {
				return json.NewEncoder(c.stdout).Encode(struct {
					Token       string `json:"token"`
					TokenSHA256 string `json:"token_sha256"`
				}{tok, access.HashToken(tok)})
			}
			_, err := fmt.Fprintf(c.stdout, "token: %s\ntoken_sha256: %s\n", tok, access.HashToken(tok))
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text: a labelled line for each value; json: one JSON object")
	return cmd
}

// checkTokenChars refuses a token no client could send in an
// Authorization header, by the definition FENCEGATE_API_TOKEN and
// leaseapi.WithToken use (apitoken.Valid).
func checkTokenChars(tok string) error {
	if !apitoken.Valid(tok) {
		return errors.New("the token holds a space, a control character or a non-ASCII character: no client could send it")
	}
	return nil
}

// loadAccess reads FENCEGATE_ACCESS_FILE, or returns nil when it is unset.
// Clients known by a certificate on a listener without mutual TLS can
// never be recognised: a warning says so.
func loadAccess(cfg config.Config, log *slog.Logger) (*access.File, error) {
	if cfg.AccessFile == "" {
		return nil, nil
	}
	f, err := access.Load(cfg.AccessFile)
	if err != nil {
		return nil, fmt.Errorf("FENCEGATE_ACCESS_FILE: %w", err)
	}
	if log != nil {
		warnCertClients(cfg, f.Policy(), log)
	}
	return f, nil
}

func warnCertClients(cfg config.Config, p *access.Policy, log *slog.Logger) {
	if p.HasCertClients() && cfg.APITLSClientCA == "" {
		log.Warn("the access file names clients by certificate, but the lease API does not ask for client certificates (FENCEGATE_API_TLS_CLIENT_CA is unset): those clients cannot authenticate")
	}
}
