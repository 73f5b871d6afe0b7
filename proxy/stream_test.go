package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/memstore"
)

// patternReader yields n bytes of a fixed pattern without allocating.
type patternReader struct{ n, off int }

var pattern = []byte("fencegate streams bodies through without holding them: 0123456789abcdef\n")

// patternRun is pattern repeated past 64 KiB, so that Read fills a buffer
// with a few copies (one race-detector check each) instead of a store per
// byte: the large-body tests spend their time relaying, not generating.
var patternRun = bytes.Repeat(pattern, 64<<10/len(pattern)+2)

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n == 0 {
		return 0, io.EOF
	}
	b = b[:min(len(b), p.n)]
	for i := 0; i < len(b); {
		i += copy(b[i:], patternRun[(p.off+i)%len(pattern):])
	}
	p.off += len(b)
	p.n -= len(b)
	return len(b), nil
}

func patternSum(n int) string {
	h := sha256.New()
	_, _ = io.Copy(h, &patternReader{n: n})
	return hex.EncodeToString(h.Sum(nil))
}

// TestLargeBodiesStreamWithBoundedMemory: a fenced 100 MiB upload and a
// 100 MiB download pass through the gate intact (the upstream and the
// client check their SHA-256) while the gate process allocates far less
// than one body: neither is held in memory.
func TestLargeBodiesStreamWithBoundedMemory(t *testing.T) {
	const size = 100 << 20
	want := patternSum(size)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/blob":
			w.Header().Set("Content-Length", strconv.Itoa(size))
			_, _ = io.CopyBuffer(w, &patternReader{n: size}, make([]byte, 64<<10))
		case r.Method == http.MethodPut && r.URL.Path == "/jobs/big":
			h := sha256.New()
			n, err := io.CopyBuffer(h, r.Body, make([]byte, 64<<10))
			fmt.Fprintf(w, "%d %v %s", n, err, hex.EncodeToString(h.Sum(nil)))
		default:
			http.NotFound(w, r)
		}
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	rules, err := ParseRules(testRules)
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(memstore.Options{})
	// Deadlines for a busy machine under -race: the body and the exchange
	// may take much longer than their defaults (10 s, 30 s) there.
	g, err := New(Options{Upstream: u, Store: st, Rules: rules, BodyTimeout: 2 * time.Minute, UpstreamTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGate(t, g).Listener.Addr().String()
	l, err := st.Acquire(context.Background(), fencing.AcquireRequest{Resource: "job:big", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := fmt.Fprintf(c, "PUT /jobs/big HTTP/1.1\r\nHost: gate\r\nFencing-Token: %s\r\nContent-Length: %d\r\n\r\n", tok(l.Token), size); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyBuffer(c, &patternReader{n: size}, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != fmt.Sprintf("%d <nil> %s", size, want) {
		t.Fatalf("upload: %d %q, want 200 and the upstream's %d bytes with SHA-256 %s", resp.StatusCode, got, size, want)
	}

	if _, err := io.WriteString(c, "GET /blob HTTP/1.1\r\nHost: gate\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.CopyBuffer(h, resp.Body, make([]byte, 64<<10))
	resp.Body.Close()
	if err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != want {
		t.Fatalf("download: %d bytes, %v, SHA-256 %x; want %d bytes with %s", n, err, h.Sum(nil), size, want)
	}

	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// Both bodies crossed the gate (and the test's own upstream): 200 MiB.
	// Everything this process allocated meanwhile stays under a tenth of one
	// body.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/10 {
		t.Fatalf("the process allocated %d MiB while 2 × %d MiB streamed through the gate: a body was held in memory", alloc>>20, size>>20)
	} else {
		t.Logf("allocated %.1f MiB while 2 × %d MiB streamed through", float64(alloc)/(1<<20), size>>20)
	}
}
