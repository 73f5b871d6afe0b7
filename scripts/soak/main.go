// Command soak drives many one-shot resources through a running fencegate
// for scripts/soak.sh: each resource is acquired on the lease API, written
// once through the write gate with its token, and released.
//
//	soak upstream -listen 127.0.0.1:PORT
//	soak run -api URL -gate URL -n N [-conns C] [-window W] [-run ID]
//	soak boltsize -file PATH
//
// upstream answers 204 to every request until it is stopped (the service
// behind the gate; it keeps nothing). run takes resources soak:<ID>:<i> for
// i in [0, N), C at a time, and prints one line per measuring window:
//
//	window=first resources=W acquire_p50_us=... acquire_p99_us=... admit_p50_us=... admit_p99_us=...
//	window=last  resources=W ...
//	total resources=N seconds=... per_second=... errors=0 retries=0
//
// "first" is the first W resources (the store holds about W records then),
// "last" the last W (it holds about N). admit is the round trip of the
// fenced write through the gate (admission plus forwarding to the
// upstream). A call answered 503 (the store did not answer in time: nothing
// was done, or, for an acquire, possibly done) is retried as a worker would,
// after its Retry-After (at most 1 s), up to 5 times, and counted in
// retries; acquire, release and the fenced write are all safe to repeat.
// Any call that still fails counts as an error; run exits 1 when there was
// one, or stops early after 100.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: soak upstream|run|boltsize [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "upstream":
		err = upstream(os.Args[2:])
	case "run":
		err = run(os.Args[2:])
	case "boltsize":
		err = boltSize(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (upstream, run or boltsize)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func upstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	_ = fs.Parse(args)
	srv := &http.Server{Addr: *listen, ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
		})}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// window collects the latencies of the resources whose index is in
// [from, to).
type window struct {
	name     string
	from, to int64
	mu       sync.Mutex
	acquire  []time.Duration
	admit    []time.Duration
}

func (w *window) add(i int64, acq, adm time.Duration) {
	if i < w.from || i >= w.to {
		return
	}
	w.mu.Lock()
	w.acquire = append(w.acquire, acq)
	w.admit = append(w.admit, adm)
	w.mu.Unlock()
}

func pct(d []time.Duration, p float64) int64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))].Microseconds()
}

func (w *window) print() {
	fmt.Printf("window=%s resources=%d acquire_p50_us=%d acquire_p99_us=%d admit_p50_us=%d admit_p99_us=%d\n",
		w.name, len(w.acquire), pct(w.acquire, .50), pct(w.acquire, .99), pct(w.admit, .50), pct(w.admit, .99))
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	api := fs.String("api", "", "lease API base URL")
	gate := fs.String("gate", "", "write gate base URL")
	n := fs.Int64("n", 2000, "resources")
	conns := fs.Int("conns", 16, "resources in flight at once")
	win := fs.Int64("window", 1000, "resources per measuring window")
	id := fs.String("run", strconv.FormatInt(time.Now().Unix(), 10), "run id, part of every resource name")
	_ = fs.Parse(args)
	if *api == "" || *gate == "" || *n < 1 || *conns < 1 || *win < 1 {
		return errors.New("run needs -api, -gate, -n >= 1, -conns >= 1 and -window >= 1")
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 2 * *conns, MaxIdleConnsPerHost: 2 * *conns, IdleConnTimeout: time.Minute}}
	first := &window{name: "first", from: 0, to: min(*win, *n)}
	last := &window{name: "last", from: max(*n-*win, 0), to: *n}
	var next, errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *conns {
		wg.Go(func() {
			for errs.Load() < 100 {
				i := next.Add(1) - 1
				if i >= *n {
					return
				}
				acq, adm, err := oneResource(client, *api, *gate, *id, i)
				if err != nil {
					if errs.Add(1) <= 5 {
						fmt.Fprintln(os.Stderr, "soak:", err)
					}
					continue
				}
				first.add(i, acq, adm)
				last.add(i, acq, adm)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	first.print()
	if last.from >= first.to {
		last.print()
	}
	fmt.Printf("total resources=%d seconds=%.1f per_second=%.0f errors=%d retries=%d\n", min(next.Load(), *n), took.Seconds(),
		float64(min(next.Load(), *n))/took.Seconds(), errs.Load(), retries.Load())
	if errs.Load() > 0 {
		return fmt.Errorf("%d calls failed", errs.Load())
	}
	return nil
}

// oneResource acquires, writes once through the gate and releases resource
// soak:<id>:<i>, returning the acquire and the write latencies.
func oneResource(c *http.Client, api, gate, id string, i int64) (acq, adm time.Duration, err error) {
	res := "soak:" + id + ":" + strconv.FormatInt(i, 10)
	t0 := time.Now()
	var lease struct {
		Token uint64 `json:"token"`
	}
	if err := call(c, http.MethodPost, api+"/v1/leases/"+res+"/acquire", `{"owner":"soak","ttl_seconds":60}`, nil, &lease); err != nil {
		return 0, 0, err
	}
	acq = time.Since(t0)
	tok := strconv.FormatUint(lease.Token, 10)
	t1 := time.Now()
	if err := call(c, http.MethodPut, gate+"/jobs/"+id+":"+strconv.FormatInt(i, 10), `{"done":true}`,
		http.Header{"Fencing-Token": {tok}}, nil); err != nil {
		return 0, 0, err
	}
	adm = time.Since(t1)
	err = call(c, http.MethodPost, api+"/v1/leases/"+res+"/release", `{"owner":"soak","token":`+tok+`,"finished":true}`, nil, nil)
	return acq, adm, err
}

// retries counts the calls repeated after a 503.
var retries atomic.Int64

// call makes one API or gate call, repeating it after a 503 as a worker
// would (see the package doc), and decodes a 2xx answer into out.
func call(c *http.Client, method, url, body string, h http.Header, out any) error {
	for attempt := 1; ; attempt++ {
		again, err := callOnce(c, method, url, body, h, out)
		if !again || attempt == 5 {
			return err
		}
		retries.Add(1)
	}
}

// callOnce makes one call; again reports a 503, after waiting its
// Retry-After (at most 1 s).
func callOnce(c *http.Client, method, url, body string, h http.Header, out any) (again bool, err error) {
	req, err := http.NewRequest(method, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	if resp.StatusCode/100 != 2 {
		err = fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, bytes.TrimSpace(b))
		if resp.StatusCode != http.StatusServiceUnavailable {
			return false, err
		}
		wait := time.Second
		if s, _ := strconv.Atoi(resp.Header.Get("Retry-After")); s >= 0 && time.Duration(s)*time.Second < wait {
			wait = time.Duration(s) * time.Second
		}
		time.Sleep(wait)
		return true, err
	}
	if out != nil {
		return false, json.Unmarshal(b, out)
	}
	return false, nil
}
