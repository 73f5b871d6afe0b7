// Command fencegate is the fencing sidecar: a lease API that hands out
// fencing tokens and a write gate that forwards a write to the upstream
// service only if its token is not older than the newest one admitted.
//
// Usage:
//
//	fencegate [serve]        run the lease API and, when FENCEGATE_UPSTREAM is set, the write gate
//	fencegate lease ...      acquire, renew, release, inspect leases and checkpoints through the API
//	fencegate run ... -- CMD run CMD while holding a lease, with its token in the environment
//	fencegate check          validate the configuration, print it (secrets redacted)
//	fencegate access hash|token
//	                         hash a bearer token for the access file, or make a new one
//	fencegate health [--url URL] [--wait D]
//	                         exit 0 when the running fencegate's /readyz answers ready
//	fencegate version        print the version
//	fencegate env            print every configuration variable with its default
//	fencegate demo-upstream [addr]
//	                         run a tiny key-value service to put the gate in front of
//	fencegate completion bash|zsh|fish
//	                         print a shell completion script
//
// Every command takes --help. The server is configured with FENCEGATE_*
// environment variables only; the client commands read FENCEGATE_API_URL
// and FENCEGATE_API_TOKEN.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/fencegate/fencegate/internal/hangup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// Only the server drains: a second signal cuts its drain short. Other
	// commands (fencegate run forwards signals to its child) keep theirs.
	beforeServe = func() { forceExitOnSecondSignal(afterLogs{&servedLogs, os.Stderr}, exitNow) }
	// SIGHUP is held from the start (internal/hangup): the server takes it
	// over for its reloads (notifyReload); every other command gives it
	// back its default action as it starts.
	beforeOther = hangup.Release
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if code, print := exitCode(err); code != exitOK {
		if print {
			fmt.Fprintln(os.Stderr, "fencegate:", err)
		}
		os.Exit(code)
	}
}

// subcommands are the commands under `fencegate`, in the order help lists
// them. To add one, write `func newXCmd(c *cli) *cobra.Command` in its own
// file and list it here.
var subcommands = []func(*cli) *cobra.Command{
	newServeCmd,
	newLeaseCmd,
	newRunCmd,
	newCheckCmd,
	newAccessCmd,
	newHealthCmd,
	newVersionCmd,
	newEnvCmd,
	newDemoUpstreamCmd,
}

// run is the whole program, with its inputs passed in so tests can drive
// it. It returns when the command is done; serve returns when ctx ends
// (after draining) or on a start-up error. The error's exit status is
// chosen with withExit; command-line mistakes exit with exitUsage.
func run(ctx context.Context, args []string, environ []string, stdout, stderr io.Writer) error {
	c := &cli{environ: environ, stdin: os.Stdin, stdout: stdout, stderr: stderr}
	root := c.rootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	var ee *exitError
	if err != nil && !c.started && !errors.As(err, &ee) {
		// Cobra refused the command line before any command ran (unknown
		// command, missing argument or required flag).
		return withExit(exitUsage, fmt.Errorf("%w\nRun '%s --help' for usage.", err, cmd.CommandPath()))
	}
	return err
}

// cli carries a command's inputs: the environment (never os.Getenv, so
// tests need no process-wide state) and its standard streams.
type cli struct {
	environ []string
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
	// started is set once the command line was accepted and a command
	// began to run.
	started bool
	// api holds the client commands' --api-url and --api-token-file
	// (apiclient.go), which override FENCEGATE_API_URL and FENCEGATE_API_TOKEN.
	api apiFlags
}

// getenv returns the value of name in c.environ, the last one if repeated.
func (c *cli) getenv(name string) string {
	v := ""
	for _, kv := range c.environ {
		if len(kv) > len(name) && kv[len(name)] == '=' && kv[:len(name)] == name {
			v = kv[len(name)+1:]
		}
	}
	return v
}

func (c *cli) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "fencegate",
		Short: "Fencing tokens for any HTTP service: a lease API and a write gate",
		Long: `fencegate hands out leases with monotonically increasing fencing tokens
(the lease API) and forwards a write to the upstream service only if its
Fencing-Token is not older than the newest one admitted (the write gate).

Run without a command, fencegate serves (see 'fencegate serve --help').`,
		Version:           Version(),
		SilenceErrors:     true,
		SilenceUsage:      true,
		RunE:              func(cmd *cobra.Command, _ []string) error { return c.serve(cmd.Context()) },
		DisableAutoGenTag: true,
	}
	root.SetVersionTemplate("fencegate {{.Version}}\n")
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetIn(c.stdin)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return withExit(exitUsage, fmt.Errorf("%w\nRun '%s --help' for usage.", err, cmd.CommandPath()))
	})
	for _, sub := range subcommands {
		root.AddCommand(sub(c))
	}
	root.InitDefaultCompletionCmd()
	if comp, _, err := root.Find([]string{"completion"}); err == nil && comp != root {
		comp.Args = cobra.ArbitraryArgs
		comp.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "completion needs a shell: bash, zsh, fish or powershell")
			}
			return usageError(cmd, "no completion for shell %q: bash, zsh, fish or powershell", args[0])
		}
	}
	c.noteStart(root)
	return root
}

// noteStart makes every command of the tree set c.started when it runs,
// after cobra checked its arguments and flags (cobra's hooks run before
// its required-flag check), and run beforeOther first unless it is the
// server (the root command runs the server too).
func (c *cli) noteStart(cmd *cobra.Command) {
	begin := func(cmd *cobra.Command) {
		c.started = true
		if beforeOther != nil && cmd.Name() != "serve" && cmd.HasParent() {
			beforeOther()
		}
	}
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			begin(cmd)
			return run(cmd, args)
		}
	} else if run := cmd.Run; run != nil {
		cmd.Run = func(cmd *cobra.Command, args []string) {
			begin(cmd)
			run(cmd, args)
		}
	}
	for _, sub := range cmd.Commands() {
		c.noteStart(sub)
	}
}

// usageError is a command-line mistake found by a command itself.
func usageError(cmd *cobra.Command, format string, args ...any) error {
	return withExit(exitUsage, fmt.Errorf(format+"\nRun '%s --help' for usage.", append(args, cmd.CommandPath())...))
}

func newServeCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the lease API and, when FENCEGATE_UPSTREAM is set, the write gate (the default command)",
		Long: `Run the lease API on FENCEGATE_API_ADDR and, when FENCEGATE_UPSTREAM is
set, the write gate on FENCEGATE_PROXY_ADDR, until SIGINT or SIGTERM; then
drain and exit 0.

serve takes no flags: it is configured with FENCEGATE_* environment
variables only ('fencegate env' lists them with their defaults).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(cmd, "serve takes no arguments; configure it with FENCEGATE_* variables (see 'fencegate env')")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return c.serve(cmd.Context()) },
	}
}

// beforeServe, when set (by main, not by tests that drive run), runs as
// the server starts; beforeOther as any other command starts.
var beforeServe, beforeOther func()

// serve runs the server (see serve in serve.go).
func (c *cli) serve(ctx context.Context) error {
	if beforeServe != nil {
		beforeServe()
	}
	return serve(ctx, c.environ, c.stderr)
}

// newCheckCmd and newHealthCmd parse their own flags (check.go,
// health.go): cobra hands them the arguments as given.
func newCheckCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Validate the FENCEGATE_* variables and route rules; print the effective configuration (secrets redacted)",
		Long: `Validate the FENCEGATE_* variables and the route rules as 'fencegate serve'
would, without contacting the store, and print the effective configuration
with secrets redacted. Exit 0 when serve would start, 2 when not.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(cmd, "check takes no arguments; it checks the FENCEGATE_* variables of its environment")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return check(c.environ, c.stdout) },
	}
}

func newHealthCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:                "health [--url URL] [--timeout D] [--wait D]",
		Short:              "Exit 0 when a running fencegate's /readyz answers ready (a container healthcheck without curl)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return health(cmd.Context(), args, c.environ, c.stdout, c.stderr)
		},
	}
}

func newVersionCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(c.stdout, "fencegate %s (%s)\n", Version(), buildDescription())
			return err
		},
	}
}

func newEnvCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "env",
		Short: "Print every FENCEGATE_* variable with its default",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return printEnv(c.stdout) },
	}
}

func newDemoUpstreamCmd(c *cli) *cobra.Command {
	return &cobra.Command{
		Use:   "demo-upstream [host:port]",
		Short: "Run a tiny key-value service to put the write gate in front of",
		Long: `Run a tiny key-value HTTP service (default 127.0.0.1:9000) that records
every write it applies with the Fencing-Token it carried: PUT, POST or
PATCH a path to store the body there, DELETE to remove it, GET a path to
read it back, GET / to list everything. It knows nothing about fencing:
the gate in front of it does.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runDemoUpstream(cmd.Context(), args, c.stderr) },
	}
}
