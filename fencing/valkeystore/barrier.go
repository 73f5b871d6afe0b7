package valkeystore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/fencegate/fencegate/fencing"
)

// The shared barrier (fencing.SharedBarrier) in Valkey. Per resource R:
//
//	P:{R}:bar     sorted set of the writes in flight through any gate
//	              (score: token; member: "<deadline ms>|<gate id>:<instance>:<seq>")
//	P:{R}:bar:ch  shard channel on which a leave is announced
//
// Both carry R's hash tag, so on a cluster the scripts, the SPUBLISH and
// the SSUBSCRIBE all go to R's slot (sharded pub/sub, which a single Redis 7
// or Valkey node serves too). Deadlines are the server's TIME plus the
// hold, judged by the scripts (lua/barrier_lib.lua).

var (
	admitRegisterScript = valkey.NewLuaScript(admitRegisterSource())
	barrierCheckScript  = valkey.NewLuaScriptRetryable(barrierSource("barrier_check"))
	barrierLeaveScript  = valkey.NewLuaScript(barrierSource("barrier_leave"))
)

// barrierSource is lua/<name>.lua with lib.lua and barrier_lib.lua
// prepended: the text the server runs.
func barrierSource(name string) string { return source("barrier_lib") + mustRead(name) }

// admitRegisterSource runs admit.lua's body as a function, so admission in
// the shared barrier is exactly Admit's, followed by the registration.
func admitRegisterSource() string {
	return source("barrier_lib") + "local function fg_admit()\n" + mustRead("admit") + "\nend\n" + mustRead("admit_register")
}

// barrierRecheck bounds the time between two checks of a waiting write
// when no wake-up arrives: pub/sub delivers at most once, and a message
// lost to a reconnection or a failover must cost a delay, not a deadlock.
var barrierRecheck = 250 * time.Millisecond

func (s *Store) barKey(res string) string { return s.prefix + ":{" + res + "}:bar" }
func (s *Store) barChan(res string) string {
	return s.prefix + ":{" + res + "}:bar:ch"
}

// ErrSharedBarrierWithWait: the shared barrier does not combine with
// Options.WaitReplicas yet.
var ErrSharedBarrierWithWait = errors.New("valkeystore: the shared barrier cannot be used with WaitReplicas > 0")

// SharedBarrierSupported reports whether this store can serve as a shared
// barrier with its options.
func (s *Store) SharedBarrierSupported() error {
	if s.waitReplicas > 0 {
		return ErrSharedBarrierWithWait
	}
	return nil
}

// entrySeq numbers the entries of this process.
var entrySeq atomic.Uint64

// AdmitRegister implements fencing.SharedBarrier: one script (admit.lua's
// check and raise, then the registration) and one round trip.
func (s *Store) AdmitRegister(ctx context.Context, req fencing.AdmitRequest, gate string, hold time.Duration) (fencing.Admission, fencing.BarrierEntry, bool, error) {
	var none fencing.BarrierEntry
	if err := req.Validate(); err != nil {
		return fencing.Admission{}, none, false, err
	}
	if err := s.SharedBarrierSupported(); err != nil {
		return fencing.Admission{}, none, false, err
	}
	if hold < time.Millisecond {
		return fencing.Admission{}, none, false, errors.New("valkeystore: shared barrier hold must be at least 1ms")
	}
	live := "0"
	if req.RequireLive {
		live = "1"
	}
	// The gate id only labels the entry (gates may be given one id): the
	// store's random instance and the sequence number make it unique, as
	// a sorted set's member must be (a second ZADD of one member would
	// replace the first, and one Leave remove both).
	id := gate + ":" + s.instance + ":" + strconv.FormatUint(entrySeq.Add(1), 10)
	before, known := s.seen.resource(req.Resource)
	top := s.seen.floor()
	args := []string{req.Token.String(), live, "0", s.retention, id, strconv.FormatInt(hold.Milliseconds(), 10)}
	sent := s.now()
	r, err := s.run(ctx, "admit", admitRegisterScript, s.admitKeys(req.Resource), args)
	if err != nil {
		return fencing.Admission{}, none, false, err
	}
	a, ok := decodeAdmitRegister(r)
	if !ok {
		if len(r) > 5 && r[0] == "OK" && r[5] != "" {
			// Registered (the reply names the entry) but unreadable:
			// remove the entry, as below.
			_ = s.Leave(ctx, fencing.BarrierEntry{Resource: req.Resource, Token: req.Token, ID: r[5]})
		}
		return fencing.Admission{}, none, false, corrupt("admit", r)
	}
	adm, err := s.admitted(ctx, req, a.admit, top, before, known, sent)
	if err != nil {
		if a.admit.kind == admitOK {
			// Registered, but the write will not be forwarded: remove the
			// entry (if that fails too, it stays until its deadline).
			_ = s.Leave(ctx, fencing.BarrierEntry{Resource: req.Resource, Token: req.Token, ID: a.member})
		}
		return fencing.Admission{}, none, false, err
	}
	return adm, fencing.BarrierEntry{Resource: req.Resource, Token: req.Token, ID: a.member, Expired: a.barrier.expired}, a.barrier.lower > 0, nil
}

// Leave implements fencing.SharedBarrier. It ends when ctx is cancelled,
// not only at its deadline (see runInt): a gate that stops cancels the
// removals it cannot wait for.
func (s *Store) Leave(ctx context.Context, e fencing.BarrierEntry) error {
	_, err := s.runInt(ctx, "barrier leave", barrierLeaveScript, []string{s.barKey(e.Resource)},
		[]string{e.ID, e.Token.String(), s.barChan(e.Resource)})
	return err
}

// WaitLower implements fencing.SharedBarrier: subscribe to the resource's
// shard channel, then check, then sleep until a message, the earliest
// deadline of the lower entries or barrierRecheck, whichever comes first.
// Subscribing before the check means a leave between the check and the
// sleep is not missed.
func (s *Store) WaitLower(ctx context.Context, e fencing.BarrierEntry) (int, error) {
	if err := s.checkOpen("barrier wait"); err != nil {
		return 0, err
	}
	tp, err := s.shared.join(ctx, s.client, s.barChan(e.Resource))
	if err != nil {
		return 0, err
	}
	defer s.shared.leave(tp)
	return fencing.WaitLowerLoop(ctx, barrierRecheck, tp.wakeChan, tp.done, func() error { return tp.err },
		func(ctx context.Context) (fencing.BarrierCheck, error) {
			r, err := s.run(ctx, "barrier check", barrierCheckScript, []string{s.barKey(e.Resource)}, []string{e.Token.String(), e.ID})
			if err != nil {
				return fencing.BarrierCheck{}, err
			}
			b, n := decodeBarrierCheck(r)
			if err := n.err(); err != nil {
				return fencing.BarrierCheck{}, err
			}
			if b.gone {
				return fencing.BarrierCheck{}, fmt.Errorf("%w: barrier wait: this write's entry in the shared barrier is gone from the server, "+
					"which lost data (the entries of the writes it waited for went with it): not forwarded", fencing.ErrUnavailable)
			}
			return fencing.BarrierCheck{Lower: b.lower, Wait: b.wait, Expired: b.expired}, nil
		})
}

// runInt runs a script whose reply is an integer, with the command
// timeout, classifying faults. Unlike run, it returns as soon as ctx is
// cancelled: valkey-go ends a call on a connection in its synchronous mode
// only at the context's deadline (set on the socket), so the call is given
// a context without a deadline, cancelled when ctx ends or the command
// timeout passes, which valkey-go waits on (the connection is pipelined
// from then on, as under concurrent calls). The error is then ctx's.
func (s *Store) runInt(ctx context.Context, op string, sc *valkey.Lua, keys, args []string) (int64, error) {
	if err := s.checkOpen(op); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cmdTimeout)
	defer cancel()
	call, end := context.WithCancel(context.WithoutCancel(ctx))
	defer end()
	defer context.AfterFunc(ctx, end)()
	n, err := sc.Exec(call, s.client, keys, args).AsInt64()
	s.noteReadOnly(err)
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		err = ctx.Err()
	}
	return n, classify(op, err)
}

// subscriptionLinger is how long a channel's subscription outlives its last
// waiter: a contended resource keeps its subscription instead of
// subscribing again for every wait.
const subscriptionLinger = 10 * time.Second

// subscriptions shares one SSUBSCRIBE per channel among the writes of this
// process waiting on it. A subscription ends subscriptionLinger after its
// last waiter left; a channel is subscribed again only once the previous
// subscription has ended, so an unsubscription in flight can never cancel
// the new one. The zero value is ready to use.
type subscriptions struct {
	mu     sync.Mutex
	topics map[string]*topic
}

// topic is one channel's subscription: wake is closed (and replaced) on
// every message; done is closed when the subscription ends, with err set.
type topic struct {
	name    string
	refs    int
	closing bool // the subscription is ending; join waits for done
	ready   chan struct{}
	done    chan struct{}
	err     error
	cancel  context.CancelFunc

	mu   sync.Mutex
	wake chan struct{}
}

func (t *topic) wakeChan() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.wake
}

func (t *topic) notify() {
	t.mu.Lock()
	close(t.wake)
	t.wake = make(chan struct{})
	t.mu.Unlock()
}

// join subscribes to channel (or shares the running subscription) and
// returns once the server confirmed it, or fails closed.
func (ss *subscriptions) join(ctx context.Context, client valkey.Client, channel string) (*topic, error) {
	ss.mu.Lock()
	if ss.topics == nil {
		ss.topics = map[string]*topic{}
	}
	tp := ss.topics[channel]
	for tp != nil && tp.closing {
		ss.mu.Unlock()
		select {
		case <-tp.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		ss.mu.Lock()
		tp = ss.topics[channel]
	}
	if tp == nil {
		tp = &topic{name: channel, ready: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{})}
		var rctx context.Context
		rctx, tp.cancel = context.WithCancel(context.Background())
		var once sync.Once
		rctx = valkey.WithOnSubscriptionHook(rctx, func(s valkey.PubSubSubscription) {
			if s.Kind == "ssubscribe" {
				once.Do(func() { close(tp.ready) })
			}
		})
		ss.topics[channel] = tp
		go func() {
			err := client.Receive(rctx, client.B().Ssubscribe().Channel(channel).Build(), func(valkey.PubSubMessage) { tp.notify() })
			if rctx.Err() == nil {
				if err == nil {
					err = errors.New("unsubscribed by the server")
				}
				tp.err = fmt.Errorf("%w: barrier wait: subscription to %s ended: %w", fencing.ErrUnavailable, channel, err)
			} else {
				tp.err = fmt.Errorf("%w: barrier wait: subscription closed", fencing.ErrUnavailable)
			}
			ss.mu.Lock()
			if ss.topics[channel] == tp {
				delete(ss.topics, channel)
			}
			ss.mu.Unlock()
			close(tp.done)
		}()
	}
	tp.refs++
	ss.mu.Unlock()
	select {
	case <-tp.ready:
		return tp, nil
	case <-tp.done:
		ss.leave(tp)
		return nil, tp.err
	case <-ctx.Done():
		ss.leave(tp)
		return nil, ctx.Err()
	}
}

// leave drops one reference; subscriptionLinger after the last one the
// subscription ends, unless a waiter joined meanwhile.
func (ss *subscriptions) leave(tp *topic) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	tp.refs--
	if tp.refs > 0 {
		return
	}
	time.AfterFunc(subscriptionLinger, func() {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if tp.refs == 0 && !tp.closing {
			tp.closing = true
			tp.cancel()
		}
	})
}
