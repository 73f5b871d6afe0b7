//go:build linux

package proxy

import (
	"slices"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/barrier"
)

// loopAdmission is a loop's writes on their way to a batched admission:
// collected during a pass, sent to the store's next batch (or to the mark
// reader's) at its end, one batch with the store at a time.
type loopAdmission struct {
	admits    []pendingAdmit      // writes for the store's next batch
	reads     []pendingAdmit      // writes for the mark reader's next batch
	admitting bool                // a batch is with the store
	admitCh   chan []pendingAdmit // to the admission worker, once started
}

// A store that admits in batches (fencing.BatchAdmitter, the Valkey store)
// gets each loop's writes together: while one batch is with the store, the
// loop collects the writes that need it, and hands them to its admission
// worker as the next batch when the first comes back. So a busy loop makes
// one store round trip, one goroutine hand-off and one wake-up per batch,
// not per write; an idle one sends each write at once, alone.
//
// A store with mark readers (fencing.MarkReaders, the Valkey store on a
// single node) gives each loop a connection of its own, driven by the loop
// like its other sockets (markConn): a batch of writes that need no live
// lease is first read there, and the writes read at the mark go on without
// leaving the loop. The rest (a raise, a refusal, a write that needs a live
// lease, a batch whose reader failed or was late) go to the worker, which
// admits them as before.

// pendingAdmit is a write of a loop waiting for the store's batch.
type pendingAdmit struct {
	c  *loopConn
	x  *exchange
	d  Decision
	t  *barrier.Ticket // registered by the worker, or for a mark reader's batch
	ok bool            // admitted and its turn: forward it
	// read: a mark reader read it and did not settle it (a raise, a
	// refusal), so the store need not read its marks again.
	read bool
}

// batches reports whether fenced write d goes to the store in a batch: a
// batching store, this gate's own barrier, one target.
func (g *Gate) batches(d Decision) bool {
	_, local := g.order.(localOrder)
	return g.batch != nil && local && len(d.Targets) == 1
}

// queueAdmit adds write c (in stAdmit) to the loop's next batch: the mark
// reader's when the store has mark readers and the write needs no live
// lease, the worker's otherwise.
func (l *eventLoop) queueAdmit(c *loopConn, d Decision) {
	p := pendingAdmit{c: c, x: c.x, d: d}
	if l.e.g.marks != nil && !l.e.s.noMarks && !d.Targets[0].Strict {
		l.admission.reads = append(l.admission.reads, p)
		return
	}
	l.admission.admits = append(l.admission.admits, p)
}

// sendAdmits sends the writes collected. Those for a mark reader go to the
// loop's reader when it is free, wait while it is busy, and go to the
// worker while the loop has none; the worker gets its writes unless a
// batch is already with it.
func (l *eventLoop) sendAdmits() {
	if len(l.admission.reads) > 0 {
		if l.marks.active(l) {
			if m := l.marks.free(); m != nil {
				m.batch, l.admission.reads = l.admission.reads, m.batch[:0]
				m.send() // should it fail, its batch joins l.admission.admits
			}
		} else {
			l.admission.admits = append(l.admission.admits, l.admission.reads...)
			clear(l.admission.reads)
			l.admission.reads = l.admission.reads[:0]
		}
	}
	if len(l.admission.admits) == 0 || l.admission.admitting {
		return
	}
	if l.admission.admitCh == nil {
		l.admission.admitCh = make(chan []pendingAdmit, 1)
		ch := l.admission.admitCh
		l.e.goTracked(workAdmission, func() { l.admitWorker(ch) })
	}
	l.admission.admitting = true
	l.admission.admitCh <- l.admission.admits
	l.admission.admits = nil
}

// admitWorker admits the batches of one loop until ch is closed (the loop
// has stopped). A write admitted whose turn has not come waits for it on a
// goroutine of its own, as on the loops' general path.
func (l *eventLoop) admitWorker(ch <-chan []pendingAdmit) {
	g := l.e.g
	var (
		reqs []fencing.AdmitRequest
		out  []fencing.Admission
		errs []error
	)
	for batch := range ch {
		reqs = reqs[:0]
		for i := range batch {
			p := &batch[i]
			tg := p.d.Targets[0]
			// Registered before the admission, as admitWrite does: a
			// write admitted before this one is already registered.
			p.t = g.barrier.Register(tg.Resource, tg.Token)
			reqs = append(reqs, fencing.AdmitRequest{Resource: tg.Resource, Token: tg.Token, RequireLive: tg.Strict, MarkRead: p.read})
		}
		out = slices.Grow(out[:0], len(reqs))[:len(reqs)] // AdmitBatch sets each
		errs = slices.Grow(errs[:0], len(reqs))[:len(reqs)]
		g.batch.AdmitBatch(l.e.ctx, reqs, out, errs) // cancelled when the loops stop
		ready := batch[:0]
		for i, p := range batch {
			if errs[i] != nil {
				p.t.Leave()
				g.refuseWrite(p.x, errs[i], reqs[i].Resource, reqs[i].Token)
				ready = append(ready, p)
				continue
			}
			p.x.audit.admitted(out[i])
			if g.passNow(p.t) {
				p.ok = true
				ready = append(ready, p)
				continue
			}
			l.awaitTurn(p)
		}
		posted := l.post(func() {
			l.admission.admitting = false
			for _, p := range ready {
				l.step(func() { p.c.admitted(p.t, p.ok) })
			}
			l.sendAdmits()
		})
		if !posted { // the loop has stopped
			for _, p := range ready {
				abandonAdmitted(g, p.x, p.t, p.ok)
			}
		}
	}
}

// awaitTurn forwards admitted write p once its turn comes (see
// Gate.waitTurn), waiting on a goroutine of its own, as on the loops'
// general path.
func (l *eventLoop) awaitTurn(p pendingAdmit) {
	l.e.goTracked(workAdmission, func() {
		ok := l.e.g.waitTurn(p.x, p.d.Targets[0], p.t, l.e.g.barrierTimeout)
		if !l.post(func() { p.c.admitted(p.t, ok) }) {
			abandonAdmitted(l.e.g, p.x, p.t, ok) // the loop has stopped
		}
	})
}
