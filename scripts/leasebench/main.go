// Command leasebench drives fencegate's lease API from a number of
// keep-alive connections for a while and prints the rate and latency of
// the lease operations it made. scripts/bench-leases.sh runs it (wrk is
// not needed); it can also be run by hand:
//
//	go run ./scripts/leasebench -url http://127.0.0.1:7070 -conns 16 -d 5s
//
// Modes (-op):
//
//	acquire  each request acquires a resource never used before (the
//	         issue's measure: a new token, one durable write, per request)
//	cycle    acquire, renew, checkpoint (a small state) and release a fresh
//	         resource: four durable writes, each counted as an operation
//
// With -fsyncprobe DIR it instead measures how many 4 KiB fdatasyncs per
// second the disk under DIR takes (Linux).
//
// Output: one line of space-separated key=value pairs (ops_per_s, p50_us,
// p99_us, ops, errors, conns, op), easy to read from a shell. A non-200
// answer counts as an error; the run goes on, and the script reports it.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	var (
		base   = flag.String("url", "http://127.0.0.1:7070", "the lease API's base URL")
		conns  = flag.Int("conns", 1, "concurrent keep-alive connections, one request in flight each")
		dur    = flag.Duration("d", 5*time.Second, "how long to run")
		op     = flag.String("op", "acquire", "acquire or cycle")
		prefix = flag.String("prefix", "", "resource name prefix (default: one unique to this run)")
		token  = flag.String("token", os.Getenv("FENCEGATE_API_TOKEN"), "bearer token, if the API needs one")
	)
	probe := flag.String("fsyncprobe", "", "instead of a run, measure fdatasync/s of 4 KiB writes in this directory for -d")
	flag.Parse()
	if *probe != "" {
		r, err := fsyncProbe(*probe, *dur)
		if err != nil {
			fmt.Fprintln(os.Stderr, "leasebench:", err)
			os.Exit(1)
		}
		fmt.Printf("fdatasync_per_s=%.0f\n", r)
		return
	}
	if *prefix == "" {
		*prefix = "lb" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	if *op != "acquire" && *op != "cycle" {
		fmt.Fprintln(os.Stderr, "leasebench: -op must be acquire or cycle")
		os.Exit(2)
	}
	tr := &http.Transport{
		MaxIdleConnsPerHost: *conns,
		MaxConnsPerHost:     *conns,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	c := &client{http: &http.Client{Transport: tr, Timeout: 30 * time.Second}, base: *base, token: *token}

	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()
	var (
		wg     sync.WaitGroup
		errs   atomic.Int64
		mu     sync.Mutex
		lat    []time.Duration
		start  = time.Now()
		worker = func(w int) {
			defer wg.Done()
			mine := make([]time.Duration, 0, 1<<14)
			for i := 0; ctx.Err() == nil; i++ {
				res := fmt.Sprintf("%s-%d-%d", *prefix, w, i)
				var err error
				if *op == "acquire" {
					err = c.acquireOnly(res, &mine)
				} else {
					err = c.cycle(res, &mine)
				}
				if err != nil && ctx.Err() == nil {
					if errs.Add(1) <= 3 {
						fmt.Fprintln(os.Stderr, "leasebench:", err)
					}
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}
	)
	for w := range *conns {
		wg.Add(1)
		go worker(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	q := func(p float64) int64 {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()
	}
	fmt.Printf("op=%s conns=%d ops=%d ops_per_s=%.0f p50_us=%d p99_us=%d errors=%d\n",
		*op, *conns, len(lat), float64(len(lat))/elapsed.Seconds(), q(0.50), q(0.99), errs.Load())
}

type client struct {
	http  *http.Client
	base  string
	token string
}

// call sends one request and records its latency in lat when it answers
// 200; it returns the decoded token of a lease answer (0 otherwise).
func (c *client) call(method, path, body string, lat *[]time.Duration) (uint64, error) {
	req, err := http.NewRequest(method, c.base+path, bytes.NewBufferString(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	t0 := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	*lat = append(*lat, time.Since(t0))
	return tokenOf(b), nil
}

// tokenOf finds `"token":N` in a lease answer without a full decode, so
// the client spends its CPU on requests rather than on JSON.
func tokenOf(b []byte) uint64 {
	i := bytes.Index(b, []byte(`"token":`))
	if i < 0 {
		return 0
	}
	b = b[i+len(`"token":`):]
	j := 0
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	v, _ := strconv.ParseUint(string(b[:j]), 10, 64)
	return v
}

func (c *client) acquireOnly(res string, lat *[]time.Duration) error {
	_, err := c.call(http.MethodPost, "/v1/leases/"+res+"/acquire", `{"owner":"bench","ttl_seconds":60}`, lat)
	return err
}

func (c *client) cycle(res string, lat *[]time.Duration) error {
	tok, err := c.call(http.MethodPost, "/v1/leases/"+res+"/acquire", `{"owner":"bench","ttl_seconds":60}`, lat)
	if err != nil {
		return err
	}
	t := strconv.FormatUint(tok, 10)
	if _, err := c.call(http.MethodPost, "/v1/leases/"+res+"/renew", `{"owner":"bench","token":`+t+`}`, lat); err != nil {
		return err
	}
	if _, err := c.call(http.MethodPut, "/v1/leases/"+res+"/checkpoint", `{"owner":"bench","token":`+t+`,"state":{"step":1}}`, lat); err != nil {
		return err
	}
	_, err = c.call(http.MethodPost, "/v1/leases/"+res+"/release", `{"owner":"bench","token":`+t+`}`, lat)
	return err
}

// fsyncProbe writes 4 KiB in place and fdatasyncs it, over and over, for
// d in a file under dir, and returns the flushes per second: what the
// disk allows a store that flushes once per commit.
func fsyncProbe(dir string, d time.Duration) (float64, error) {
	f, err := os.CreateTemp(dir, "fsyncprobe")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		buf[0]++
		if _, err := f.WriteAt(buf, 0); err != nil {
			return 0, err
		}
		if err := fdatasync(f); err != nil {
			return 0, err
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
