package leaseapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// partition cuts one client off the API: while cut, every request fails
// before it is sent, as when the network is down.
type partition struct {
	cut atomic.Bool
}

func (p *partition) RoundTrip(r *http.Request) (*http.Response, error) {
	if p.cut.Load() {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, errors.New("partitioned")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// termLog records the terms of several candidates, in order.
type termLog struct {
	mu     sync.Mutex
	events []string
	ch     chan string
}

func (l *termLog) add(ev string) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
	l.ch <- ev
}

func (l *termLog) next(t *testing.T) string {
	t.Helper()
	select {
	case ev := <-l.ch:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatalf("no election event; so far %v", l.events)
		return ""
	}
}

// Two candidates campaign; the leader is cut off from the API. It steps
// down at its local deadline (27 s), before the server expires its lease
// (30 s); the other takes over with a newer token only then.
func TestCampaignHandsOverOnLoss(t *testing.T) {
	e := newSessionEnv(t)
	log := &termLog{ch: make(chan string, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	campaign := func(name string, client *leaseapi.Client) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := leaseapi.ElectionOptions{
				Session: leaseapi.SessionOptions{Owner: name, TTL: 30 * time.Second, Clock: e.clock},
				OnStepDown: func(l fencing.Lease, err error) {
					log.add(fmt.Sprintf("%s stepped down %d lost=%v", name, l.Token, errors.Is(err, leaseapi.ErrSessionLost)))
				},
			}
			err := leaseapi.Campaign(ctx, client, "job:1", opts, func(ctx context.Context, s *leaseapi.Session) error {
				log.add(fmt.Sprintf("%s leads %d", name, s.Token()))
				<-ctx.Done()
				log.add(fmt.Sprintf("%s stops %d", name, s.Token()))
				return nil
			})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Campaign = %v", name, err)
			}
		}()
	}
	cutA := &partition{}
	campaign("a", leaseapi.NewClient(e.srv.URL, leaseapi.WithHTTPClient(&http.Client{Transport: cutA})))
	if ev := log.next(t); ev != "a leads 1" {
		t.Fatalf("first event %q", ev)
	}
	campaign("b", e.client) // waits on the server
	e.clock.waitTimer(t, e.at(10*time.Second))
	cutA.cut.Store(true)
	e.clock.Advance(10 * time.Second)
	e.clock.waitTimer(t, e.at(12*time.Second)) // a's renewal failed; it retries every 2 s
	e.clock.Advance(17 * time.Second)          // until its deadline, 27 s
	if ev := log.next(t); ev != "a stops 1" {
		t.Fatalf("event %q, want a to stop", ev)
	}
	if ev := log.next(t); ev != "a stepped down 1 lost=true" {
		t.Fatalf("event %q", ev)
	}
	if st := e.status(t); st.Lease == nil || st.Lease.Owner != "a" {
		t.Fatalf("a stopped leading after the server expired its lease: %+v", st.Lease)
	}
	e.clock.Advance(3*time.Second + time.Millisecond) // the server expires a's lease
	if ev := log.next(t); ev != "b leads 2" {
		t.Fatalf("event %q, want b to lead with token 2", ev)
	}
	cancel()
	wg.Wait()
	if ev := log.next(t); ev != "b stops 2" {
		t.Fatalf("event %q", ev)
	}
	if st := e.status(t); st.Lease != nil || st.Previous == nil || st.Previous.Owner != "b" || st.Previous.Ended != fencing.EndReleased {
		t.Fatalf("b did not release on stepping down: %+v %+v", st.Lease, st.Previous)
	}
}

// A lead function that returns ends the term: the lease is released and
// the candidate campaigns again, getting a newer token.
func TestCampaignStepsDownWhenLeadReturns(t *testing.T) {
	e := newSessionEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var tokens []fencing.Token
	var stepDowns atomic.Int64
	done := make(chan error, 1)
	go func() {
		opts := leaseapi.ElectionOptions{
			Session:    leaseapi.SessionOptions{Owner: "a", TTL: 30 * time.Second, Clock: e.clock},
			OnStepDown: func(fencing.Lease, error) { stepDowns.Add(1) },
		}
		done <- leaseapi.Campaign(ctx, e.client, "job:1", opts, func(_ context.Context, s *leaseapi.Session) error {
			tokens = append(tokens, s.Token())
			if len(tokens) == 3 {
				cancel()
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Campaign did not return")
	}
	if fmt.Sprint(tokens) != "[1 2 3]" || stepDowns.Load() != 3 {
		t.Fatalf("tokens %v, %d step-downs", tokens, stepDowns.Load())
	}
	if st := e.status(t); st.Lease != nil || st.Issued != 3 {
		t.Fatalf("after the campaign: %+v issued %d", st.Lease, st.Issued)
	}
}

// TestCampaignReleasesALeaseAcquiredAsItEnds: a campaign whose context
// ends just as its acquisition succeeds returns without leading, and
// releases that lease rather than leave its session renewing it for as
// long as the process lives.
func TestCampaignReleasesALeaseAcquiredAsItEnds(t *testing.T) {
	e := newSessionEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The acquisition's answer arrives, then the campaign ends.
	client := leaseapi.NewClient(e.srv.URL, leaseapi.WithHTTPClient(&http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err == nil && strings.HasSuffix(r.URL.Path, "/acquire") {
			body, rerr := io.ReadAll(resp.Body) // whole, before the end
			resp.Body.Close()
			if rerr != nil {
				return nil, rerr
			}
			resp.Body = io.NopCloser(bytes.NewReader(body))
			cancel()
		}
		return resp, err
	})}))
	led := false
	err := leaseapi.Campaign(ctx, client, "job:1", leaseapi.ElectionOptions{
		Session: leaseapi.SessionOptions{Owner: "a", TTL: 30 * time.Second, Clock: e.clock},
	}, func(context.Context, *leaseapi.Session) error { led = true; return nil })
	if !errors.Is(err, context.Canceled) || led {
		t.Fatalf("Campaign: %v, led %v; want context.Canceled without leading", err, led)
	}
	st := e.status(t)
	if st.Issued != 1 || st.Lease != nil || st.Previous == nil || st.Previous.Ended != fencing.EndReleased {
		t.Fatalf("after the campaign: lease %+v, previous %+v; want the lease acquired and released", st.Lease, st.Previous)
	}
}

// TestCampaignReportsAcquireErrors: a candidate that cannot reach the API
// reports each failed acquisition to OnAcquireError and tries again after
// RetryInterval on its clock; once the API is back it leads.
func TestCampaignReportsAcquireErrors(t *testing.T) {
	e := newSessionEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cut := &partition{}
	cut.cut.Store(true)
	client := leaseapi.NewClient(e.srv.URL, leaseapi.WithHTTPClient(&http.Client{Transport: cut}))
	failures := make(chan error, 16)
	led := make(chan fencing.Token, 1)
	done := make(chan error, 1)
	go func() {
		done <- leaseapi.Campaign(ctx, client, "job:1", leaseapi.ElectionOptions{
			Session:        leaseapi.SessionOptions{Owner: "a", TTL: 30 * time.Second, Clock: e.clock, RetryInterval: 5 * time.Second},
			OnAcquireError: func(err error) { failures <- err },
		}, func(ctx context.Context, s *leaseapi.Session) error {
			led <- s.Token()
			<-ctx.Done()
			return nil
		})
	}()
	for i := range 2 {
		select {
		case err := <-failures:
			if !strings.Contains(err.Error(), "partitioned") {
				t.Fatalf("failure %d reported as %v, want the transport's error", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("failure %d not reported", i)
		}
		e.clock.waitTimer(t, e.at(time.Duration(i+1)*5*time.Second)) // the retry pause
		if i == 1 {
			cut.cut.Store(false)
		}
		e.clock.Advance(5 * time.Second)
	}
	select {
	case tok := <-led:
		if tok != 1 {
			t.Fatalf("led with token %d, want 1", tok)
		}
	case err := <-failures:
		t.Fatalf("failure reported once the API was back: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("did not lead once the API was back")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Campaign = %v", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
