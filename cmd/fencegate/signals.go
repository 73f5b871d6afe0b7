package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// forceExitOnSecondSignal lets an operator cut the drain short: the first
// SIGTERM or SIGINT starts the graceful drain (signal.NotifyContext in
// main); a second one exits at once with status 1, writes in flight
// included (the upstream may still apply them). Both signals reach this
// channel, so none is lost between the two registrations.
func forceExitOnSecondSignal(stderr io.Writer, exit func(int)) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ch
		s := <-ch
		fmt.Fprintf(stderr, "fencegate: second signal (%v) during the drain: exiting now; requests in flight were cut off and writes among them may still be applied by the upstream\n", s)
		exit(exitFailure)
	}()
}
