package leaseapi_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/leaseapi"
)

// heldAtOnce is a lease API that answers every acquisition lease-held at
// once, ignoring wait_seconds, as an older or misbehaving server might; it
// counts the acquisitions.
func heldAtOnce(t *testing.T, retryAfter string) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/problem+json")
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"type":"urn:fencegate:problem:lease-held","title":"Conflict","status":409,"code":"lease-held","detail":"held","holder":"other"}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestCampaignPacesAServerThatAnswersAtOnce: a campaign against a server
// that answers lease-held without waiting pauses at least
// AcquireRetryFloor between attempts instead of hammering it (the loop
// used to retry at once, thousands of times a second).
func TestCampaignPacesAServerThatAnswersAtOnce(t *testing.T) {
	srv, n := heldAtOnce(t, "")
	const span = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), span)
	defer cancel()
	err := leaseapi.Campaign(ctx, leaseapi.NewClient(srv.URL), "job:1", leaseapi.ElectionOptions{
		Session: leaseapi.SessionOptions{Owner: "a", TTL: 30 * time.Second},
	}, func(context.Context, *leaseapi.Session) error { t.Error("led without a lease"); return nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign = %v", err)
	}
	// Every pause is at least the floor, so no more than this many
	// attempts fit in span, however the goroutines are scheduled.
	if most := int64(span/leaseapi.AcquireRetryFloor) + 1; n.Load() < 1 || n.Load() > most {
		t.Fatalf("%d acquisitions in %v, want 1 to %d", n.Load(), span, most)
	}
}

// TestAcquireBackoff: the floor after a server's wait; after early answers
// a doubling pause, at least the Retry-After, at most the cap (before
// jitter of up to half the pause).
func TestAcquireBackoff(t *testing.T) {
	within := func(what string, got, base time.Duration) {
		t.Helper()
		if got < base || got > base+base/2 {
			t.Errorf("%s: pause %v, want %v to %v", what, got, base, base+base/2)
		}
	}
	held := &leaseapi.ProblemError{Status: 409, Code: "lease-held", Type: "urn:fencegate:problem:lease-held"}
	var b leaseapi.AcquireBackoff
	floor := leaseapi.AcquireRetryFloor
	within("after a wait", b.Pause(held, 60*time.Second, 60*time.Second), floor)
	within("1st early answer", b.Pause(held, 60*time.Second, time.Millisecond), floor)
	within("2nd early answer", b.Pause(held, 60*time.Second, time.Millisecond), 2*floor)
	within("3rd early answer", b.Pause(held, 0, 0), 4*floor)
	for range 20 {
		b.Pause(held, 0, 0)
	}
	within("many early answers", b.Pause(held, 0, 0), leaseapi.AcquireRetryCap)
	within("after a wait again", b.Pause(held, time.Second, 950*time.Millisecond), floor)
	held.RetryAfter = 2 * time.Second
	within("early, with Retry-After", b.Pause(held, time.Second, 0), 2*time.Second)
	held.RetryAfter = time.Hour
	within("early, with a long Retry-After", b.Pause(held, time.Second, 0), leaseapi.AcquireRetryCap)
	within("after a wait, with a long Retry-After", b.Pause(held, time.Second, time.Second), floor)
}

// TestClientStopsReadingAnEndlessAnswer: a 2xx answer larger than any the
// lease API sends fails with ErrBadAnswer after MaxAnswerBytes, without
// reading the rest (the client used to read up to 256 MiB).
func TestClientStopsReadingAnEndlessAnswer(t *testing.T) {
	var written atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"resource":"job:1","owner":"`)
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		for {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := leaseapi.NewClient(srv.URL).Status(ctx, "job:1")
	if !errors.Is(err, leaseapi.ErrBadAnswer) || !errors.Is(err, fencing.ErrAmbiguous) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("Status of an endless answer: %v; want ErrBadAnswer saying it is too large", err)
	}
	srv.Close() // waits for the handler, which stops once the connection is gone
	// What the kernel buffers on loopback comes on top of what was read,
	// but nowhere near this.
	if got := written.Load(); got > 3*leaseapi.MaxAnswerBytes {
		t.Fatalf("the server wrote %d bytes before the client gave up; want it stopped after about %d", got, leaseapi.MaxAnswerBytes)
	}
}

// TestClientBadAnswers: a 2xx answer the client cannot use, cut off or
// not the API's JSON, is ErrBadAnswer (and ambiguous: a 2xx may have taken
// effect), not a bare decoding error.
func TestClientBadAnswers(t *testing.T) {
	for name, h := range map[string]http.HandlerFunc{
		"html": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html><body>It works!</body></html>")
		},
		"cut off": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "1000")
			_, _ = io.WriteString(w, `{"resource":"job:1",`)
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		},
		"bad time": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"resource":"job:1","owner":"a","token":1,"ttl_seconds":30,"acquired_at":"soon","expires_at":"later"}`)
		},
		// A lease without a token (tokens start at 1) or of another
		// resource: decoded, they used to be answered as the lease.
		"token 0": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"resource":"job:1","owner":"a","token":0,"ttl_seconds":30,"acquired_at":"2030-01-01T00:00:00Z","expires_at":"2030-01-01T00:00:30Z"}`)
		},
		"empty object": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{}`)
		},
		"another resource": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"resource":"job:2","owner":"a","token":1,"ttl_seconds":30,"acquired_at":"2030-01-01T00:00:00Z","expires_at":"2030-01-01T00:00:30Z"}`)
		},
	} {
		srv := httptest.NewServer(h)
		c := leaseapi.NewClient(srv.URL)
		_, err := c.Renew(context.Background(), "job:1", "a", 1, 0)
		if !errors.Is(err, leaseapi.ErrBadAnswer) || !errors.Is(err, fencing.ErrAmbiguous) {
			t.Errorf("%s: Renew = %v; want ErrBadAnswer", name, err)
		}
		_, err = leaseapi.NewSession(context.Background(), c, "job:1", leaseapi.SessionOptions{Owner: "a"})
		if !errors.Is(err, leaseapi.ErrBadAnswer) {
			t.Errorf("%s: NewSession = %v; want ErrBadAnswer", name, err)
		}
		// Not {"released": ...}: not "already ended" either.
		if released, err := c.Release(context.Background(), "job:1", "a", 1, false); !errors.Is(err, leaseapi.ErrBadAnswer) {
			t.Errorf("%s: Release = %v, %v; want ErrBadAnswer", name, released, err)
		}
		srv.Close()
	}
}

// TestListStopsOnACursorThatDoesNotMove: a server that answers every page
// with the same next_cursor (a cache between, a broken proxy) would make
// Leases and ListAll yield its leases for ever; they stop at the page that
// repeats, with ErrBadAnswer, as `fencegate lease list --all` does.
func TestListStopsOnACursorThatDoesNotMove(t *testing.T) {
	var pages atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pages.Add(1) > 20 { // ends the loop of a client that follows it
			http.Error(w, "enough", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"leases":[{"resource":"job:1","owner":"w","token":5,"ttl_seconds":30,"acquired_at":"2030-01-01T00:00:00Z","expires_at":"2030-01-01T00:00:30Z"}],"next_cursor":"am9iOjE"}`)
	}))
	defer srv.Close()
	c := leaseapi.NewClient(srv.URL)
	var got []string
	var err error
	for l, e := range c.Leases(context.Background(), "job:", 1) {
		if err = e; e == nil {
			got = append(got, l.Resource)
		}
	}
	if n := pages.Load(); n != 2 || len(got) != 1 || !errors.Is(err, leaseapi.ErrBadAnswer) {
		t.Fatalf("Leases read %d pages, yielded %v, err %v; want 2 pages, job:1 once, then ErrBadAnswer", n, got, err)
	}
	pages.Store(0)
	if all, err := c.ListAll(context.Background(), "job:", 1); pages.Load() != 2 || all != nil || !errors.Is(err, leaseapi.ErrBadAnswer) {
		t.Fatalf("ListAll read %d pages: %v, %v; want 2 pages and ErrBadAnswer", pages.Load(), all, err)
	}
	// Pages that go round (A, B, A...) end too, at the page that comes back.
	var round atomic.Int64
	cycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		round.Add(1)
		next := "A"
		if r.URL.Query().Get("cursor") == "A" {
			next = "B"
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"leases":[],"next_cursor":"`+next+`"}`)
	}))
	defer cycle.Close()
	if _, err := leaseapi.NewClient(cycle.URL).ListAll(context.Background(), "job:", 1); round.Load() != 3 || !errors.Is(err, leaseapi.ErrBadAnswer) {
		t.Fatalf("ListAll on cursors A, B, A: %v after %d pages; want ErrBadAnswer after 3", err, round.Load())
	}
}

// TestProblemFromAPI: only a problem document of the lease API, with its
// code and type, counts as a refusal by the API; a plain 404 or another
// API's JSON error does not.
func TestProblemFromAPI(t *testing.T) {
	e := newEnv(t, storeKinds[0], nil)
	_, err := leaseapi.NewClient(e.srv.URL).ReadCheckpoint(context.Background(), "job:none")
	var pe *leaseapi.ProblemError
	if !errors.As(err, &pe) || !pe.FromAPI() || pe.Code != "no-checkpoint" {
		t.Fatalf("the API's no-checkpoint: %v (%+v); want a problem FromAPI", err, pe)
	}
	for name, h := range map[string]http.HandlerFunc{
		"plain 404": http.NotFound,
		"405":       func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusMethodNotAllowed) },
		"another API's JSON": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"code":"no-checkpoint","message":"no such route"}`)
		},
	} {
		srv := httptest.NewServer(h)
		_, err := leaseapi.NewClient(srv.URL).ReadCheckpoint(context.Background(), "job:1")
		srv.Close()
		if !errors.As(err, &pe) || pe.FromAPI() {
			t.Errorf("%s: %v (%+v); want a ProblemError not FromAPI", name, err, pe)
		}
	}
}
