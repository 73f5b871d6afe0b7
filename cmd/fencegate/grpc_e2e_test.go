package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fencegate/fencegate/internal/certs/certstest"
)

// listenUnix listens on a Unix socket named name in a fresh directory of
// the system's temporary one (short: a socket path has a length limit),
// removed when the test ends.
func listenUnix(t *testing.T, name string) (string, net.Listener) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fg-sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, name)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	return sock, ln
}

// rawCodec carries gRPC messages as raw bytes: the test service needs no
// generated code.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

// jobsService is a gRPC service with a unary write (Put), a client-streaming
// write (Upload) and a read (Get), recording every call it sees with its
// fencing-token.
type jobsService struct {
	mu    sync.Mutex
	calls []string // "Method token [messages]"
}

func (s *jobsService) note(ctx context.Context, method string, extra string) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.calls = append(s.calls, method+" "+first(md.Get("fencing-token"))+extra)
	s.mu.Unlock()
}

func (s *jobsService) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func first(v []string) string {
	if len(v) == 0 {
		return "-"
	}
	return v[0]
}

var jobsDesc = grpc.ServiceDesc{
	ServiceName: "fencegate.test.Jobs",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Put", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			srv.(*jobsService).note(ctx, "Put", " "+string(in))
			out := []byte("ok")
			return &out, nil
		}},
		{MethodName: "Get", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			srv.(*jobsService).note(ctx, "Get", "")
			out := []byte("value")
			return &out, nil
		}},
	},
	Streams: []grpc.StreamDesc{{StreamName: "Upload", ClientStreams: true, Handler: func(srv any, st grpc.ServerStream) error {
		n := 0
		for {
			var m []byte
			err := st.RecvMsg(&m)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			n++
		}
		srv.(*jobsService).note(st.Context(), "Upload", " "+strconv.Itoa(n))
		out := []byte("stored")
		return st.SendMsg(&out)
	}}},
}

// TestGRPCServiceBehindTheGate puts a real grpc-go service, listening on a
// Unix socket and speaking HTTP/2 (h2c), behind the gate, which serves
// mutual TLS: a grpc-go client's unary and client-streaming calls with the
// live token reach the service; a stale token gets codes.Aborted with
// fencing-code stale-token, a missing one FailedPrecondition, and the
// service never sees either; a read RPC under a pass rule needs no token.
func TestGRPCServiceBehindTheGate(t *testing.T) {
	sock, ln := listenUnix(t, "jobs.sock")
	svc := &jobsService{}
	gs := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	gs.RegisterService(&jobsDesc, svc)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	set := certstest.New(t)
	rules := "POST /fencegate.test.Jobs/Get pass\nPOST /fencegate.test.Jobs/{method} fence grpc:jobs\n"
	p := start(t, t.TempDir(), []string{"FENCEGATE_STORE=memory:", "FENCEGATE_UPSTREAM=unix:" + sock,
		"FENCEGATE_UPSTREAM_HTTP2=true", "FENCEGATE_RULES=" + rules,
		"FENCEGATE_PROXY_TLS_CERT=" + set.ServerCert, "FENCEGATE_PROXY_TLS_KEY=" + set.ServerKey,
		"FENCEGATE_PROXY_TLS_CLIENT_CA=" + set.CAFile, "FENCEGATE_TLS_WATCH=0"}, "api", "gate")

	roots := x509.NewCertPool()
	roots.AddCert(set.CA.Cert)
	clientCert, err := tls.X509KeyPair(set.Client.CertPEM, set.Client.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///"+p.addr["gate"],
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}, ServerName: "localhost"})),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	acquire := func(owner string) string {
		st, l, _ := call(t, "POST", p.url("api", "/v1/leases/grpc:jobs/acquire"), nil, `{"owner":"`+owner+`","ttl_seconds":1}`)
		if st != 200 {
			t.Fatalf("acquire for %s: %d %v", owner, st, l)
		}
		return strconv.FormatInt(token(t, l), 10)
	}
	put := func(tok string) (*metadata.MD, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if tok != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "fencing-token", tok)
		}
		in, out := []byte("job"), []byte(nil)
		var trailer metadata.MD
		err := conn.Invoke(ctx, "/fencegate.test.Jobs/Put", &in, &out, grpc.Trailer(&trailer))
		return &trailer, err
	}
	upload := func(tok string, msgs int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "fencing-token", tok)
		st, err := conn.NewStream(ctx, &jobsDesc.Streams[0], "/fencegate.test.Jobs/Upload")
		if err != nil {
			return err
		}
		for range msgs {
			m := []byte("chunk")
			if err := st.SendMsg(&m); err != nil {
				break // the answer says why
			}
		}
		if err := st.CloseSend(); err != nil {
			return err
		}
		var out []byte
		return st.RecvMsg(&out)
	}

	old := acquire("a")
	if _, err := put(old); err != nil {
		t.Fatalf("Put with the live token: %v", err)
	}
	// The lease expires; b takes it and writes: a's token is stale now.
	time.Sleep(1100 * time.Millisecond)
	live := acquire("b")
	if err := upload(live, 3); err != nil {
		t.Fatalf("Upload with the live token: %v", err)
	}
	before := svc.seen()

	tr, err := put(old)
	if status.Code(err) != codes.Aborted || first(tr.Get("fencing-code")) != "stale-token" {
		t.Fatalf("Put with a stale token: %v, fencing-code %v; want Aborted, stale-token", err, tr.Get("fencing-code"))
	}
	if err := upload(old, 3); status.Code(err) != codes.Aborted {
		t.Fatalf("Upload with a stale token: %v, want Aborted", err)
	}
	if _, err := put(""); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Put without a token: %v, want FailedPrecondition", err)
	}
	if got := svc.seen(); len(got) != len(before) {
		t.Fatalf("the service saw refused calls: %q (before them: %q)", got, before)
	}
	want := []string{"Put " + old + " job", "Upload " + live + " 3"}
	if got := svc.seen(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("the service saw %q, want %q", got, want)
	}

	// A read RPC under a pass rule needs no token.
	in, out := []byte("q"), []byte(nil)
	if err := conn.Invoke(context.Background(), "/fencegate.test.Jobs/Get", &in, &out); err != nil || string(out) != "value" {
		t.Fatalf("Get: %q %v", out, err)
	}
}
