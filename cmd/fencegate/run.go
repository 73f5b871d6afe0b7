package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// runOptions are the flags of `fencegate run`.
type runOptions struct {
	resource        string
	owner           string
	ttl             time.Duration
	wait            waitFlag
	finishOnSuccess bool
	killAfter       time.Duration
}

const runHelp = `Take the lease on RESOURCE (waiting up to --wait while another owner holds
it; any duration, or forever), then run CMD with these variables added to its
environment:

  FENCING_RESOURCE   the resource
  FENCING_TOKEN      the fencing token, to send as the Fencing-Token header
  FENCING_OWNER      the lease's owner
  FENCEGATE_API_URL  the lease API (FENCEGATE_API_TOKEN and the TLS variables,
                     FENCEGATE_API_CA_FILE and FENCEGATE_API_CLIENT_CERT/KEY,
                     are passed on as they are)

While CMD runs the lease is renewed every TTL/3, and transient failures are
retried every TTL/10. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to CMD;
one that comes while the lease is still awaited ends the wait instead: CMD is
not started, and fencegate run exits 130 (129 for SIGHUP, 131 for SIGQUIT).
When CMD exits the lease is released (marked finished with --finish-on-success
if CMD exited 0) and fencegate run exits with CMD's status (128+N if a signal N
ended it).

If the lease is lost while CMD runs, because a renewal is refused or is not
confirmed before a conservative local deadline (the time the last confirmed
acquire or renew request was sent, plus the TTL, minus TTL/10; the server's
timestamps are never used), CMD is sent SIGTERM at once and SIGKILL after
--kill-after, and fencegate run exits 76. The lost lease is left to expire.

CMD runs in its own process group, and signals go to the whole group, so
the children of a shell script are stopped with it. CMD is therefore not in
the terminal's foreground group: it should not read from the terminal.

While another owner holds the lease, acquisitions are repeated as for
'fencegate lease acquire --wait' (paced, never past --wait), and the wait
is reported on stderr as it reports it. Each acquisition
is bounded by its wait plus 10s: an API that takes the connection and never
answers ends fencegate run about then, with exit 4.

Exit status:
  CMD's   CMD ran and exited (0 on success)
  2       usage: bad flags or arguments
  3       refused by the API at acquisition (other than lease-held)
  4       at acquisition: the lease API or its store is unavailable, did not
          answer within the wait plus 10s, or what answered is not the API
  75      the lease was not acquired within --wait (lease-held)
  76      the lease was lost while CMD ran
  127     CMD could not be started
  130     SIGINT or SIGTERM before CMD started (129 SIGHUP, 131 SIGQUIT)

CMD's status is passed through as it is: a CMD exiting 2, 3, 4, 75, 76 or 127
cannot be told from fencegate run's own by the status alone (fencegate run
then says why on stderr, which CMD shares). Wrap CMD to keep its statuses
apart if that matters: -- sh -c './job; s=$?; case $s in 2|3|4|75|76|127|130)
exit 100;; esac; exit $s'`

func newRunCmd(c *cli) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run --resource RESOURCE [flags] -- CMD [ARG...]",
		Short: "Run CMD while holding the lease on RESOURCE, with its fencing token in the environment",
		Long:  runHelp,
		Example: `  fencegate run --resource job:42 --ttl 30s -- ./process-job.sh 42
  fencegate run --resource nightly-report --wait 0s --finish-on-success -- \
      sh -c 'curl -fsS -X PUT -H "Fencing-Token: $FENCING_TOKEN" --data @report.json http://127.0.0.1:8080/reports/today'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(cmd, "run needs a command to run after --")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(cmd); err != nil {
				return err
			}
			return c.runUnderLease(cmd.Context(), o, args)
		},
	}
	f := cmd.Flags()
	// CMD's own flags are CMD's: flag parsing stops at the first argument.
	f.SetInterspersed(false)
	f.StringVar(&o.resource, "resource", "", "the resource to lease (required)")
	f.StringVar(&o.owner, "owner", "", "the lease's owner (default: HOST:PID:RANDOM, unique per process)")
	f.DurationVar(&o.ttl, "ttl", 30*time.Second, "lease duration, whole seconds from 1s to 24h")
	o.wait = waitFlag{d: fencing.MaxWait}
	f.Var(&o.wait, "wait", "wait up to this long (any duration, or forever) for another owner's lease to end")
	f.BoolVar(&o.finishOnSuccess, "finish-on-success", false, "release with finished=true when CMD exits 0")
	f.DurationVar(&o.killAfter, "kill-after", 10*time.Second, "after a lost lease's SIGTERM, send SIGKILL this much later")
	c.api.register(f)
	_ = cmd.MarkFlagRequired("resource")
	return cmd
}

func (o *runOptions) check(cmd *cobra.Command) error {
	if err := fencing.ValidateResource(o.resource); err != nil {
		return usageError(cmd, "--resource %q: %v", o.resource, err)
	}
	if o.owner == "" && cmd.Flags().Changed("owner") {
		return usageError(cmd, "--owner is empty (leave it out for the default owner)")
	}
	if o.owner == "" {
		// Host and pid, and a random suffix: two processes that are both
		// pid 1 of a container on one host (fencegate as the image's
		// entrypoint) must not take one lease as one owner.
		o.owner = leaseapi.DefaultOwner()
	}
	if err := checkOwner(cmd, o.owner); err != nil {
		return err
	}
	if err := fencing.ValidateTTL(o.ttl); err != nil {
		return usageError(cmd, "--ttl %v: %v", o.ttl, err)
	}
	if o.killAfter < 0 {
		return usageError(cmd, "--kill-after must not be negative")
	}
	return nil
}

// forwardedSignals are the signals fencegate run passes on to CMD's
// process group (which no terminal signal reaches: see runUnderLease):
// every one that would otherwise end fencegate run alone, leaving CMD
// running on with nothing renewing its lease.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// runUnderLease is `fencegate run`: acquire, start CMD, keep the lease
// while CMD runs, release, and exit with CMD's status.
func (c *cli) runUnderLease(ctx context.Context, o runOptions, argv []string) error {
	if err := runAvailable(); err != nil {
		return withExit(exitUsage, err)
	}
	client, err := c.client()
	if err != nil {
		return err
	}
	base, _ := c.apiURL()
	// Subscribe before CMD starts so no signal meant for it is missed; the
	// process-wide handler in main cancels ctx, which only matters before
	// CMD runs (it abandons the acquisition).
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, forwardedSignals...)
	defer signal.Stop(sigc)
	// A stopped fencegate run could not renew the lease while CMD, in a
	// process group of its own, went on: the job-control stop is ignored.
	ignoreJobStop()

	sess, sig, err := c.acquireUnlessSignalled(ctx, client, o, sigc)
	if sig != nil {
		code := exitInterrupted
		if n := sig.(syscall.Signal); n != syscall.SIGINT && n != syscall.SIGTERM {
			code = 128 + int(n) // as a shell reports a process that n ended
		}
		what := "(a call in flight may have taken effect)"
		if err == nil {
			// Acquired as the signal came: CMD is not started for it.
			c.release(context.WithoutCancel(ctx), sess, false)
			what = "(the lease, acquired as the signal came, is released)"
		}
		return withExit(code, fmt.Errorf("interrupted by %v while acquiring %s: the command was not started %s", sig, o.resource, what))
	}
	var pe *leaseapi.ProblemError
	switch {
	case errors.As(err, &pe) && !pe.FromAPI():
		return c.apiFailure(err) // not the lease API's answer: exit 4
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		// The API took the connection and did not answer within the wait
		// plus acquireGrace: not acquired, because the API is unusable.
		fmt.Fprintf(c.stderr, "fencegate run: the lease API at %s did not answer the acquisition within --wait plus %v; not acquired (had the API taken it, the lease expires after its TTL): %v\n", base, acquireGrace, err)
		return withExit(exitUnavailable, nil)
	case errors.Is(err, fencing.ErrLeaseHeld):
		_ = c.apiFailure(err) // prints the problem
		return withExit(exitNotAcquired, nil)
	case errors.Is(err, leaseapi.ErrSessionLost):
		// The API took longer than the lease's local deadline to grant
		// or confirm it: it was never safely held. Not 75: no other
		// owner holds it, the API is too slow to hold it with this TTL.
		fmt.Fprintf(c.stderr, "fencegate run: the lease API at %s did not confirm the lease before its local deadline (--ttl %v); not acquired: %v\n", base, o.ttl, err)
		return withExit(exitUnavailable, nil)
	case err != nil:
		return c.apiFailure(err)
	}
	// Keep the work out of ctx's hands from here on: signals are
	// forwarded to CMD, and the lease is released after it exits.
	bg := context.WithoutCancel(ctx)

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append([]string(nil), c.environ...),
		"FENCING_RESOURCE="+o.resource,
		"FENCING_TOKEN="+sess.Token().String(),
		"FENCING_OWNER="+o.owner,
		"FENCEGATE_API_URL="+base,
	)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = c.stdin, c.stdout, c.stderr
	cmd.SysProcAttr = commandAttr()
	if err := cmd.Start(); err != nil {
		c.release(bg, sess, false)
		return withExit(127, fmt.Errorf("run: %w", err))
	}
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()

	lostc := sess.Done() // only a loss ends the session while CMD runs
	var killc <-chan time.Time
	var waitErr error
	for running := true; running; {
		select {
		case sig := <-sigc:
			signalGroup(cmd.Process.Pid, sig.(syscall.Signal))
		case <-lostc:
			lostc = nil
			fmt.Fprintf(c.stderr, "fencegate run: %v; stopping the command (SIGTERM now, SIGKILL in %v)\n", sess.Err(), o.killAfter)
			signalGroup(cmd.Process.Pid, syscall.SIGTERM)
			killc = time.After(o.killAfter)
		case <-killc:
			signalGroup(cmd.Process.Pid, syscall.SIGKILL)
		case waitErr = <-waitc:
			running = false
		}
	}
	status := childStatus(waitErr)
	// Whatever CMD left running in its group (a background job) must not
	// work on past the release, or past a loss: it goes first.
	signalGroup(cmd.Process.Pid, syscall.SIGKILL)
	// A loss decided while CMD was exiting still counts (Err also checks
	// the local deadline): the work may not be complete under the lease,
	// and a lost lease is not released.
	if sess.Err() == nil {
		if gone := c.release(bg, sess, o.finishOnSuccess && status == 0); gone {
			// The server says the lease had ended before the release: the
			// work may have ended outside it, as after a loss.
			return withExit(exitLeaseLost, nil)
		}
	}
	if err := sess.Err(); errors.Is(err, leaseapi.ErrSessionLost) {
		if lostc != nil {
			fmt.Fprintf(c.stderr, "fencegate run: %v while the command was exiting\n", err)
		}
		// Whatever CMD left behind in its group must not write on.
		signalGroup(cmd.Process.Pid, syscall.SIGKILL)
		return withExit(exitLeaseLost, nil)
	}
	if status != 0 {
		return withExit(status, nil)
	}
	return nil
}

// acquireUnlessSignalled is openSession, ended by any of the signals
// fencegate run forwards (read from sigc) while it waits: they are meant
// for CMD, which is not running yet, so they end the acquisition, and CMD
// is not started. It returns the signal that came, if one did (also when
// the acquisition succeeded just as it came, or when main's context was
// cancelled by SIGINT or SIGTERM before sigc delivered it), and the
// session or openSession's error.
func (c *cli) acquireUnlessSignalled(ctx context.Context, client *leaseapi.Client, o runOptions, sigc <-chan os.Signal) (*leaseapi.Session, os.Signal, error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop, caught := make(chan struct{}), make(chan os.Signal, 1)
	go func() {
		defer close(caught)
		select {
		case sig := <-sigc:
			caught <- sig
			cancel()
		case <-stop:
		}
	}()
	sess, err := c.openSession(actx, client, o)
	close(stop)
	sig := <-caught // nil when none came
	if sig == nil && ctx.Err() != nil {
		select {
		case sig = <-sigc:
		default:
			sig = syscall.SIGINT // main's context ends only on SIGINT or SIGTERM
		}
	}
	return sess, sig, err
}

// openSession acquires the lease as a session, with the acquisition loop
// of acquireWaiting (waiting up to o.wait, or forever, while another owner
// holds it). The session outlives the loop's contexts: they bound each
// acquisition only.
func (c *cli) openSession(ctx context.Context, client *leaseapi.Client, o runOptions) (*leaseapi.Session, error) {
	var sess *leaseapi.Session
	err := c.acquireWaiting(ctx, "fencegate run", o.resource, o.wait, func(actx context.Context, wait time.Duration) error {
		var err error
		sess, err = leaseapi.NewSession(actx, client, o.resource, leaseapi.SessionOptions{
			Owner: o.owner, TTL: o.ttl, Wait: wait,
			// The session's default margin is TTL/10 already; run retries a
			// failed renewal every TTL/10, as its help says.
			RetryInterval: o.ttl / 10,
			OnRetry: func(err error) {
				fmt.Fprintf(c.stderr, "fencegate run: renewal failed, retrying: %v\n", err)
			},
		})
		return err
	})
	return sess, err
}

// release ends the session and its lease after CMD exited; a failure is
// reported, not fatal: the lease then expires on its own.
//
// It reports whether the server answered that the lease had already ended
// (released false, or lease-lost): the session was then lost without
// knowing it (a store that failed over, a pause the local clock did not
// see).
func (c *cli) release(ctx context.Context, sess *leaseapi.Session, finished bool) (gone bool) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	released, err := sess.Release(ctx, finished)
	switch {
	case err == nil && !released:
		fmt.Fprintln(c.stderr, "fencegate run: the lease had already ended when the command exited (the server released nothing): its work may have ended outside it")
		return true
	case errors.Is(err, fencing.ErrLeaseLost):
		fmt.Fprintf(c.stderr, "fencegate run: the lease had already ended when the command exited: its work may have ended outside it: %v\n", err)
		return true
	case err != nil:
		fmt.Fprintf(c.stderr, "fencegate run: releasing the lease: %v\n", err)
	}
	return false
}

// childStatus is the exit status a shell would report for CMD.
func childStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitFailure
}
