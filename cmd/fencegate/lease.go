package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// callTimeout bounds one lease API call of the CLI, so a server that
// stopped answering does not hang a script.
const callTimeout = 30 * time.Second

// acquireGrace bounds an acquisition (of `lease acquire` and `run`) beyond
// the wait it asked the server for: more than the server's rounding of
// wait_seconds up to a second plus its store's timeouts, so a slow store
// still answers store-unavailable, yet short enough that a server that
// accepted the connection and never answers ends the command near its
// --wait.
const acquireGrace = 10 * time.Second

const leaseHelp = `The lease commands call the lease API at --api-url, else FENCEGATE_API_URL,
else ` + config.DefaultAPIURL + `, with "Authorization: Bearer TOKEN" when a token
is given: the first line of --api-token-file, else FENCEGATE_API_TOKEN. For an
https:// API with a private CA, FENCEGATE_API_CA_FILE names the CA bundle; for
a mutual-TLS API, FENCEGATE_API_CLIENT_CERT and FENCEGATE_API_CLIENT_KEY name
the client certificate and key (which may then replace the token, see
docs/access.md). The API's JSON answer is printed on stdout, on one line, as
the API sent it; a refusal prints its application/problem+json document on
stderr.

Exit status:
  0  success
  2  usage: bad flags or arguments, or a request the API found invalid (400)
  3  refused by the API, with one of its problem documents: lease-held,
     lease-lost, no-checkpoint, unauthorized, payload-too-large, ...
  4  unavailable: the lease API is unreachable or did not answer in time (30s;
     an acquisition: its wait plus 10s), or answered 5xx (its store is
     unavailable), or what answered is not the lease API (an error page that
     is not its problem document, a body that is not its JSON or is larger
     than it ever sends)`

func newLeaseCmd(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "Acquire, renew, release and inspect leases through the lease API",
		Long:  "Acquire, renew, release and inspect leases through the lease API.\n\n" + leaseHelp,
		Example: `  fencegate lease acquire job:42 --owner worker-a --ttl 30s --wait 10s
  fencegate lease renew job:42 --owner worker-a --token 7
  fencegate lease checkpoint job:42 --owner worker-a --token 7 --state '{"done":17}'
  fencegate lease release job:42 --owner worker-a --token 7 --finished
  fencegate lease status job:42
  fencegate lease checkpoint job:42
  fencegate lease list --prefix job: --limit 100`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "lease needs a command: acquire, renew, release, status, list or checkpoint")
			}
			return usageError(cmd, "unknown lease command %q", args[0])
		},
	}
	c.api.register(cmd.PersistentFlags())
	cmd.AddCommand(c.leaseAcquireCmd(), c.leaseRenewCmd(), c.leaseReleaseCmd(), c.leaseStatusCmd(), c.leaseListCmd(), c.leaseCheckpointCmd())
	return cmd
}

func (c *cli) leaseAcquireCmd() *cobra.Command {
	var owner, output string
	var ttl time.Duration
	var wait waitFlag
	cmd := &cobra.Command{
		Use:   "acquire RESOURCE --owner OWNER [--ttl 30s] [--wait 10s|forever] [--output json|token]",
		Short: "Take the lease on RESOURCE and print it with its fencing token",
		Long: `Take the lease on RESOURCE for OWNER and print the lease (with its fencing
token), or with --output token the token alone:

  T=$(fencegate lease acquire job:42 --owner worker-a --output token)

Re-acquiring a live lease as its owner extends it and keeps its token.
While another owner holds it the API answers lease-held (exit 3), after
waiting up to --wait for it to end. --wait takes any duration, or forever:
the command repeats the API's bounded waits (60s each) until the lease is
acquired, as etcdctl lock and consul lock block. Each repeat pauses 100ms
(plus jitter) first; after an answer that came without the API's wait, the
pause doubles up to 5s and honours the answer's Retry-After (up to 5s). No
repeat starts that would pause past --wait.

The first attempt asks the API not to wait. When it finds the lease held
and --wait leaves time, the command says on stderr that it waits (the
holder, how long its lease runs, how long the command waits), again when
the holder changes or, at most every 30s, that it is still waiting, and
once acquired, after how long. Stdout carries only the answer; an
acquisition that did not wait writes nothing on stderr.

` + leaseHelp,
		Args:              resourceArg,
		ValidArgsFunction: c.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			body := map[string]any{"owner": owner}
			if err := checkOwner(cmd, owner); err != nil {
				return err
			}
			if err := ttlMember(cmd, body, ttl); err != nil {
				return err
			}
			if output != "json" && output != "token" {
				return usageError(cmd, "--output %q: want json or token", output)
			}
			return c.acquire(cmd, args[0], body, wait, output == "token")
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "the worker taking the lease (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "lease duration, whole seconds from 1s to 24h (default: the server's)")
	cmd.Flags().Var(&wait, "wait", "wait up to this long (any duration, or forever) for another owner's lease to end")
	cmd.Flags().StringVarP(&output, "output", "o", "json", "json: the lease as the API answered; token: the fencing token alone")
	_ = cmd.MarkFlagRequired("owner")
	return cmd
}

// acquire is `lease acquire`: the acquisition loop of acquireWaiting,
// then the lease (or its token) on stdout.
func (c *cli) acquire(cmd *cobra.Command, resource string, body map[string]any, wait waitFlag, tokenOnly bool) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	err = c.acquireWaiting(cmd.Context(), "fencegate", resource, wait, func(ctx context.Context, wait time.Duration) error {
		if wait > 0 {
			body["wait_seconds"] = int64((wait + time.Second - 1) / time.Second)
		} else {
			delete(body, "wait_seconds")
		}
		var err error
		raw, err = client.Call(ctx, http.MethodPost, leasePath(resource, "/acquire"), nil, body)
		return err
	})
	if err != nil {
		return c.apiFailure(err)
	}
	// Only a lease of resource with a valid token is printed, as JSON or
	// as its token: anything else is not the API's answer, and a script
	// must not go on with it.
	lease, err := leaseapi.DecodeLease(raw, resource)
	if err != nil {
		return c.apiFailure(fmt.Errorf("%w: %.200s", err, raw))
	}
	if !tokenOnly {
		return printJSONLine(c.stdout, raw)
	}
	_, err = fmt.Fprintln(c.stdout, lease.Token)
	return err
}

// sleepCtx waits d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// waitFlag is a --wait value: a duration >= 0, or forever.
type waitFlag struct {
	d       time.Duration
	forever bool
}

func (w *waitFlag) String() string {
	if w.forever {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" {
		*w = waitFlag{forever: true}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return errors.New(`want a duration >= 0 such as 90s or 10m, or "forever"`)
	}
	*w = waitFlag{d: d}
	return nil
}

func (w *waitFlag) Type() string { return "duration|forever" }

func (c *cli) leaseRenewCmd() *cobra.Command {
	var owner string
	var token uint64
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "renew RESOURCE --owner OWNER --token TOKEN [--ttl 30s]",
		Short: "Extend the live lease held by OWNER with TOKEN",
		Long: `Extend the live lease on RESOURCE held by OWNER with TOKEN, by --ttl or by
its current TTL, and print it. Not the live holder (including an expired
lease): lease-lost (exit 3).

` + leaseHelp,
		Args:              resourceArg,
		ValidArgsFunction: c.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			body := map[string]any{"owner": owner, "token": token}
			if err := checkOwner(cmd, owner); err != nil {
				return err
			}
			if err := ttlMember(cmd, body, ttl); err != nil {
				return err
			}
			return c.callAPI(cmd, http.MethodPost, leasePath(args[0], "/renew"), nil, body, 0, heldLease(args[0], owner, token))
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "the lease's owner (required)")
	cmd.Flags().Uint64Var(&token, "token", 0, "the lease's fencing token (required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "new lease duration, whole seconds from 1s to 24h (default: the lease's)")
	_ = cmd.MarkFlagRequired("owner")
	_ = cmd.MarkFlagRequired("token")
	return cmd
}

func (c *cli) leaseReleaseCmd() *cobra.Command {
	var owner string
	var token uint64
	var finished bool
	cmd := &cobra.Command{
		Use:   "release RESOURCE --owner OWNER --token TOKEN [--finished]",
		Short: "End the lease held by OWNER with TOKEN",
		Long: `End the lease on RESOURCE held by OWNER with TOKEN now, and print
{"released": true}; --finished tells the next holder the work is done.
A lease that already ended with no newer token issued answers
{"released": false} (exit 0); a newer token or another owner answers
lease-lost (exit 3).

` + leaseHelp,
		Args:              resourceArg,
		ValidArgsFunction: c.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOwner(cmd, owner); err != nil {
				return err
			}
			body := map[string]any{"owner": owner, "token": token}
			if finished {
				body["finished"] = true
			}
			return c.callAPI(cmd, http.MethodPost, leasePath(args[0], "/release"), nil, body, 0, func(raw []byte) error {
				_, err := leaseapi.DecodeReleased(raw)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "the lease's owner (required)")
	cmd.Flags().Uint64Var(&token, "token", 0, "the lease's fencing token (required)")
	cmd.Flags().BoolVar(&finished, "finished", false, "mark the work finished for the next holder")
	_ = cmd.MarkFlagRequired("owner")
	_ = cmd.MarkFlagRequired("token")
	return cmd
}

func (c *cli) leaseStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status RESOURCE",
		Short: "Print RESOURCE's tokens, live lease, previous holder and checkpoint",
		Long: `Print RESOURCE's issued and high-water tokens, its live lease, how the
previous holder left and its checkpoint's size. An unknown resource
answers zeros and nulls (exit 0).

` + leaseHelp,
		Args:              resourceArg,
		ValidArgsFunction: c.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.callAPI(cmd, http.MethodGet, leasePath(args[0], ""), nil, nil, 0, nil)
		},
	}
}

func (c *cli) leaseListCmd() *cobra.Command {
	var prefix, cursor string
	var limit int
	var all bool
	cmd := &cobra.Command{
		Use:   "list [--prefix PREFIX] [--limit N] [--cursor CURSOR | --all]",
		Short: "Print the live leases, in resource order",
		Long: `Print the live leases whose resource starts with --prefix, in resource
order: one page of at most --limit of them (0: the server's maximum, 1000),
after --cursor (the next_cursor of the page before; none: the first page).
The answer's next_cursor continues the listing; null means the last page.

With --all, follow next_cursor to the end (--limit is then the page size)
and print every lease in one answer, {"leases": [...], "next_cursor": null}.
A lease live for the whole listing appears exactly once; one taken or ended
meanwhile may or may not.

` + leaseHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if prefix != "" {
				if err := fencing.ValidateResourcePrefix(prefix); err != nil {
					return usageError(cmd, "--prefix: %v", err)
				}
			}
			if limit < 0 || limit > fencing.MaxListLimit {
				return usageError(cmd, "--limit: must be between 0 and %d", fencing.MaxListLimit)
			}
			if all && cursor != "" {
				return usageError(cmd, "--all lists from the start: it does not take --cursor")
			}
			q := leaseapi.ListQuery(prefix, limit, cursor)
			if all {
				return c.listAll(cmd, q)
			}
			return c.callAPI(cmd, http.MethodGet, "/v1/leases", q, nil, 0, nil)
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "only resources starting with this")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many leases per page (0: the server's maximum)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue after the page that answered this next_cursor")
	cmd.Flags().BoolVar(&all, "all", false, "follow next_cursor and print every lease")
	return cmd
}

// listAll follows next_cursor from the first page of query q to the last
// and prints every lease as one answer. Each page has its own call timeout;
// a failed page fails the command as that call's failure.
func (c *cli) listAll(cmd *cobra.Command, q url.Values) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	leases := []json.RawMessage{}
	seen := map[string]bool{q.Get("cursor"): true} // the cursors followed: pages that go round never end
	for {
		ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
		raw, err := client.Call(ctx, http.MethodGet, "/v1/leases", q, nil)
		cancel()
		if err != nil {
			return c.apiFailure(err)
		}
		var page struct {
			Leases     []json.RawMessage `json:"leases"`
			NextCursor *string           `json:"next_cursor"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return c.apiFailure(fmt.Errorf("%w: a page that is not a lease list: %w", leaseapi.ErrBadAnswer, err))
		}
		leases = append(leases, page.Leases...)
		if page.NextCursor == nil {
			break
		}
		if *page.NextCursor == "" || seen[*page.NextCursor] {
			return c.apiFailure(fmt.Errorf("%w: a next_cursor that does not move on", leaseapi.ErrBadAnswer))
		}
		seen[*page.NextCursor] = true
		q.Set("cursor", *page.NextCursor)
	}
	out, err := json.Marshal(struct {
		Leases     []json.RawMessage `json:"leases"`
		NextCursor *string           `json:"next_cursor"`
	}{Leases: leases})
	if err != nil {
		return err
	}
	return printJSONLine(c.stdout, out)
}

func (c *cli) leaseCheckpointCmd() *cobra.Command {
	var owner, state string
	var token uint64
	cmd := &cobra.Command{
		Use:   "checkpoint RESOURCE [--owner OWNER --token TOKEN --state JSON|-]",
		Short: "Print RESOURCE's last checkpoint, or save one",
		Long: `Without flags, print RESOURCE's last checkpoint: its state, the token that
saved it, when, and how the previous holder left; no checkpoint answers
no-checkpoint (exit 3).

With --owner, --token and --state, save STATE (any JSON value; "-" reads it
from stdin) as the live holder, which also renews the lease, and print the
renewed lease. Not the live holder: lease-lost (exit 3).

` + leaseHelp,
		Args:              resourceArg,
		ValidArgsFunction: c.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			path := leasePath(args[0], "/checkpoint")
			set := 0
			for _, name := range []string{"owner", "token", "state"} {
				if cmd.Flags().Changed(name) {
					set++
				}
			}
			switch set {
			case 0:
				return c.callAPI(cmd, http.MethodGet, path, nil, nil, 0, nil)
			case 3:
			default:
				return usageError(cmd, "saving a checkpoint needs --owner, --token and --state together")
			}
			if err := checkOwner(cmd, owner); err != nil {
				return err
			}
			raw := []byte(state)
			if state == "-" {
				var err error
				if raw, err = io.ReadAll(c.stdin); err != nil {
					return fmt.Errorf("reading the state from stdin: %w", err)
				}
			}
			raw = bytes.TrimSpace(raw)
			if !json.Valid(raw) {
				return usageError(cmd, "--state: not a JSON value")
			}
			body := map[string]any{"owner": owner, "token": token, "state": json.RawMessage(raw)}
			return c.callAPI(cmd, http.MethodPut, path, nil, body, 0, heldLease(args[0], owner, token))
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "the lease's owner (to save)")
	cmd.Flags().Uint64Var(&token, "token", 0, "the lease's fencing token (to save)")
	cmd.Flags().StringVar(&state, "state", "", `the state to save, a JSON value, or "-" for stdin`)
	return cmd
}

// resourceArg accepts exactly one valid resource name.
func resourceArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError(cmd, "%s needs exactly one RESOURCE, got %d arguments", cmd.Name(), len(args))
	}
	if err := fencing.ValidateResource(args[0]); err != nil {
		return usageError(cmd, "RESOURCE %q: %v", args[0], err)
	}
	return nil
}

func checkOwner(cmd *cobra.Command, owner string) error {
	if err := fencing.ValidateOwner(owner); err != nil {
		return usageError(cmd, "--owner: %v", err)
	}
	return nil
}

// ttlMember sets body's ttl_seconds from the --ttl flag when it was given.
// A given --ttl must be whole seconds from 1s to 24h, as the API's
// ttl_seconds: --ttl 0s is a usage error, as it is for fencegate run, not
// the server's default (leave --ttl out for that).
func ttlMember(cmd *cobra.Command, body map[string]any, ttl time.Duration) error {
	if !cmd.Flags().Changed("ttl") {
		return nil
	}
	if err := fencing.ValidateTTL(ttl); err != nil {
		return usageError(cmd, "--ttl %v: %v", ttl, err)
	}
	body["ttl_seconds"] = int64(ttl / time.Second)
	return nil
}

func leasePath(resource, suffix string) string {
	return "/v1/leases/" + url.PathEscape(resource) + suffix
}

// heldLease checks a 2xx answer to a renewal or a checkpoint of the lease
// owner holds with token: that lease, or ErrBadAnswer (exit 4).
func heldLease(resource, owner string, token uint64) func([]byte) error {
	return func(raw []byte) error {
		_, err := leaseapi.DecodeHeldLease(raw, resource, owner, fencing.Token(token))
		return err
	}
}
