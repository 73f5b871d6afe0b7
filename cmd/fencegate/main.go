// Command fencegate is the fencing sidecar: a lease API that hands out
// fencing tokens and a write gate that forwards a write to the upstream
// service only if its token is not older than the newest one admitted.
//
// Usage:
//
//	fencegate [serve]   run the lease API and, when FENCEGATE_UPSTREAM is set, the write gate
//	fencegate check     validate the configuration, print it (secrets redacted)
//	fencegate health [--url URL]
//	                    exit 0 when the running fencegate's /readyz answers ready
//	fencegate version   print the version
//	fencegate env       print every configuration variable with its default
//	fencegate demo-upstream [addr]
//	                    run a tiny key-value service to put the gate in front of
//
// Configuration comes from FENCEGATE_* environment variables only.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	forceExitOnSecondSignal(os.Stderr, os.Exit)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if code, print := exitCode(err); code != exitOK {
		if print {
			fmt.Fprintln(os.Stderr, "fencegate:", err)
		}
		os.Exit(code)
	}
}

// run is the whole program, with its inputs passed in so tests can drive
// it: it returns when ctx ends (after draining) or on a start-up error.
func run(ctx context.Context, args []string, environ []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "serve":
		if len(args) > 1 {
			return fmt.Errorf("serve takes no arguments; configure it with FENCEGATE_* variables (see 'fencegate env')")
		}
		return serve(ctx, environ, stderr)
	case "version", "--version", "-v":
		_, err := fmt.Fprintf(stdout, "fencegate %s (%s)\n", Version(), buildDescription())
		return err
	case "env":
		return printEnv(stdout)
	case "check":
		return check(args[1:], environ, stdout)
	case "health":
		return health(ctx, args[1:], environ, stdout, stderr)
	case "demo-upstream":
		return runDemoUpstream(ctx, args[1:], stderr)
	case "help", "--help", "-h":
		_, err := io.WriteString(stdout, usage)
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

const usage = `usage: fencegate [serve | check | health [--url URL] | version | env | demo-upstream [addr] | help]

  serve    run the lease API (FENCEGATE_API_ADDR) and, when FENCEGATE_UPSTREAM
           is set, the write gate (FENCEGATE_PROXY_ADDR); the default command
  check    validate the FENCEGATE_* variables and the route rules, print the
           effective configuration (secrets redacted); exit 0 if valid, 2 if not
  health [--url URL]
           exit 0 when /readyz on FENCEGATE_API_ADDR (or URL) answers ready,
           1 otherwise: a container healthcheck without curl
  version  print the version
  env      print every FENCEGATE_* variable with its default
  demo-upstream [addr]
           run a tiny key-value service that records every write it applies
           (default 127.0.0.1:9000), to try the write gate in front of
`
