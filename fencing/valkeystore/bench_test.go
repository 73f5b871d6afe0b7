package valkeystore

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// BenchmarkStore runs the conformance benchmarks against a real server.
func BenchmarkStore(b *testing.B) {
	srv := valkeytest.Start(b)
	fencingtest.RunBenchmarks(b, harness(srv.URL(), 0))
}

// BenchmarkAdmitParallel admits the holder's token from 32 goroutines per
// CPU: one EVALSHA per call, auto-pipelined by valkey-go.
func BenchmarkAdmitParallel(b *testing.B) {
	srv := valkeytest.Start(b)
	benchAdmitParallel(b, open(b, srv.URL(), freshPrefix()))
}

// BenchmarkCycleParallel runs acquire/renew/release cycles from 32
// goroutines per CPU, each on its own resource.
func BenchmarkCycleParallel(b *testing.B) {
	srv := valkeytest.Start(b)
	benchCycleParallel(b, open(b, srv.URL(), freshPrefix()))
}

func benchCycleParallel(b *testing.B, s *Store) {
	ctx := context.Background()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		res := "cyc" + strconv.FormatInt(prefixSeq.Add(1), 10)
		for pb.Next() {
			l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "w", TTL: time.Minute})
			if err == nil {
				_, err = s.Renew(ctx, fencing.RenewRequest{Resource: res, Owner: "w", Token: l.Token})
			}
			if err == nil {
				_, err = s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "w", Token: l.Token})
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

func benchAdmitParallel(b *testing.B, s *Store) {
	ctx := context.Background()
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: "hot", Owner: "w", TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Admit(ctx, fencing.AdmitRequest{Resource: "hot", Token: l.Token}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admits/s")
}

var rpsRE = regexp.MustCompile(`([0-9.]+) requests per second`)

// TestCompareRedisBenchmark measures, against one server in one run, the
// store's parallel Admit (Go, valkey-go auto-pipelining, 32 goroutines per
// CPU) and redis-benchmark running the same admit script by EVALSHA (50
// clients, no pipelining), and prints both and their ratio, then the
// store's parallel acquire/renew/release cycle rate. It runs only with
// FENCEGATE_VALKEY_BENCH=1:
//
//	FENCEGATE_VALKEY_BENCH=1 go test -run CompareRedisBenchmark -v ./fencing/valkeystore/
func TestCompareRedisBenchmark(t *testing.T) {
	if os.Getenv("FENCEGATE_VALKEY_BENCH") != "1" {
		t.Skip("set FENCEGATE_VALKEY_BENCH=1 to compare with redis-benchmark")
	}
	path, err := exec.LookPath("valkey-benchmark")
	if err != nil {
		if path, err = exec.LookPath("redis-benchmark"); err != nil {
			t.Skip("no valkey-benchmark or redis-benchmark on PATH")
		}
	}
	tool := filepath.Base(path)
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	s := open(t, srv.URL(), prefix)

	res := testing.Benchmark(func(b *testing.B) { benchAdmitParallel(b, s) })
	goRate := float64(res.N) / res.T.Seconds()
	cyc := testing.Benchmark(func(b *testing.B) { benchCycleParallel(b, s) })

	l, err := s.Acquire(context.Background(), fencing.AcquireRequest{Resource: "hot", Owner: "w", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sha := srv.MustDo("SCRIPT", "LOAD", admitSrc)
	port := srv.Addr()[len("127.0.0.1:"):]
	args := append([]string{"-h", "127.0.0.1", "-p", port, "-n", "200000", "-c", "50", "-P", "1", "-q", "evalsha", sha, "3"}, s.admitKeys("hot")...)
	out, err := exec.Command(path, append(args, l.Token.String(), "0")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", tool, err, out)
	}
	m := rpsRE.FindAllSubmatch(out, -1)
	if m == nil {
		t.Fatalf("no rate in %s output:\n%s", tool, out)
	}
	toolRate, _ := strconv.ParseFloat(string(m[len(m)-1][1]), 64)
	if st, err := s.Status(context.Background(), "hot"); err != nil || st.HighWater != l.Token {
		t.Fatalf("the EVALSHA runs did not admit the token: %+v, %v", st, err)
	}
	t.Logf("store Admit (Go, %d ops): %.0f admits/s", res.N, goRate)
	t.Logf("%s EVALSHA admit (-n 200000 -c 50 -P 1): %.0f requests/s", tool, toolRate)
	t.Logf("ratio store/%s: %.2f", tool, goRate/toolRate)
	t.Logf("store acquire+renew+release (Go, %d cycles): %.0f cycles/s = %.0f scripts/s", cyc.N, float64(cyc.N)/cyc.T.Seconds(), 3*float64(cyc.N)/cyc.T.Seconds())
}

// BenchmarkReplicaAdmit compares, on one server with one replica, admits
// without and with WaitReplicas=1:
//
//   - equal: the holder's token from 32 goroutines per CPU (after the first,
//     every admission is at a confirmed mark);
//
//   - raise: acquire, admit (which raises the mark: with WaitReplicas one
//     WAIT), release, from 32 goroutines per CPU on their own resources.
//
//     FENCEGATE_REQUIRE_VALKEY=1 go test -run - -bench ReplicaAdmit -benchtime 2s ./fencing/valkeystore/
func BenchmarkReplicaAdmit(b *testing.B) {
	p := valkeytest.Start(b)
	valkeytest.StartReplica(b, p)
	for _, n := range []int{0, 1} {
		b.Run("equal/wait="+strconv.Itoa(n), func(b *testing.B) {
			benchAdmitParallel(b, openWait(b, p.URL(), freshPrefix(), n, nil))
		})
		b.Run("raise/wait="+strconv.Itoa(n), func(b *testing.B) {
			benchRaiseParallel(b, openWait(b, p.URL(), freshPrefix(), n, nil))
		})
	}
}

func benchRaiseParallel(b *testing.B, s *Store) {
	ctx := context.Background()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		res := "raise" + strconv.FormatInt(prefixSeq.Add(1), 10)
		for pb.Next() {
			l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: "w", TTL: time.Minute})
			if err == nil {
				var a fencing.Admission
				if a, err = s.Admit(ctx, fencing.AdmitRequest{Resource: res, Token: l.Token}); err == nil && !a.Raised {
					b.Error("the admission did not raise the mark")
					return
				}
			}
			if err == nil {
				_, err = s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: "w", Token: l.Token})
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "raises/s")
}
