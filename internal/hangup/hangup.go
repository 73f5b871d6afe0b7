// Package hangup holds SIGHUP from the first moments of the process, so
// that a SIGHUP sent while the server starts is kept for its reload loop
// instead of taking the default action, which ends the process.
//
// It subscribes in its init function. Go initialises a package as soon as
// the packages it imports are, in import-path order, so this one (which
// imports only the standard library's signal handling) runs before the
// long initialisations of the telemetry, gRPC and store client libraries:
// a few milliseconds after exec instead of tens. What comes before it, the
// runtime's and the standard library's own start, cannot be covered from
// Go, and a SIGHUP there still ends the process.
//
// Exactly one of Handover (the server) and Release (every other command)
// is called, once the command is known.
package hangup

import (
	"os"
	"os/signal"
	"syscall"
)

// early receives SIGHUP from init until Handover or Release.
var early = make(chan os.Signal, 1)

func init() {
	signal.Notify(early, syscall.SIGHUP)
}

// Handover subscribes ch to SIGHUP, then stops holding it here; a SIGHUP
// that came before is passed on to ch (which should have room for one).
// ch is subscribed first, so no moment is left without a subscriber.
func Handover(ch chan<- os.Signal) {
	signal.Notify(ch, syscall.SIGHUP)
	signal.Stop(early)
	select {
	case s := <-early:
		select {
		case ch <- s:
		default: // ch already holds one: one reload serves both
		}
	default:
	}
}

// Release gives SIGHUP back its default action (end the process) for a
// command that does not reload, such as a client command in a terminal
// that closes. It is called when the command starts, before the command
// subscribes to anything itself (fencegate run forwards SIGHUP to its
// child). A SIGHUP that came while it was held is raised again, so it
// takes that action now.
func Release() {
	signal.Stop(early)
	select {
	case <-early:
		if self, err := os.FindProcess(os.Getpid()); err == nil {
			_ = self.Signal(syscall.SIGHUP) // where there is no SIGHUP, none came
		}
	default:
	}
}
