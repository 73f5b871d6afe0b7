package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/fencegate/fencegate/internal/logwriter"
)

// afterLogs writes to out after writing out the log lines the server's
// log writer (logs, when set) still holds: a message that must come after
// them, such as the one before a forced exit.
type afterLogs struct {
	logs *atomic.Pointer[logwriter.Writer]
	out  io.Writer
}

func (a afterLogs) Write(p []byte) (int, error) {
	if w := a.logs.Load(); w != nil {
		w.Flush()
	}
	return a.out.Write(p)
}

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
