package leaseapi

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/fencing/problem"
)

// decodeSeeds are bodies of every shape the two decoders must agree on:
// accepted ones, and each kind of refusal.
var decodeSeeds = []string{
	`{"owner":"w","ttl_seconds":30,"wait_seconds":5}`,
	`{"owner":"w","token":1,"state":{"a":[1,2,{"owner":"x"}],"b":"}\"{"}}`,
	`{"owner":"w","token":18446744073709551615,"finished":true}`,
	` {"owner" : "w" , "ttl_seconds" : null } `,
	`{"owner":"w","owner":"v"}`, `{"Owner":"w"}`, `{"own\u0065r":"w"}`, `{"owner":"w\"x"}`,
	`{"owner":1}`, `{"ttl_seconds":1e3}`, `{"token":-1}`, `{"state":[1,2]}`, `{"x":1}`,
	`{"owner":`, `[]`, `null`, `"owner"`, `1`, `{} {}`, `{}x`, "", "   ", `{"a":1,}`,
	`{"owner":"\xff"}`, `{"ttl_seconds":99999999999999999999}`,
}

// FuzzDecodeAgrees checks decodeJSON against decodeJSONStream, the
// reference: for every body and body limit, on every request type, the
// same refusal (status, code, text) or the same decoded value.
func FuzzDecodeAgrees(f *testing.F) {
	for _, seed := range decodeSeeds {
		f.Add([]byte(seed), uint16(1024))
		f.Add([]byte(seed), uint16(len(seed)/2))
	}
	f.Fuzz(func(t *testing.T, data []byte, limit uint16) {
		for _, kind := range []any{&acquireBody{}, &renewBody{}, &releaseBody{}, &checkpointBody{}} {
			got, want := newLike(kind), newLike(kind)
			gotErr := decodeJSON(limited(data, int64(limit)), int64(limit), got)
			wantErr := decodeJSONStream(limited(data, int64(limit)), int64(limit), want)
			if msg := sameRefusal(gotErr, wantErr); msg != "" {
				t.Fatalf("%T %q (limit %d): %s", kind, data, limit, msg)
			}
			if gotErr == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("%T %q: decoded %+v, the reference %+v", kind, data, got, want)
			}
		}
	})
}

// limited reads data as a request body of at most limit bytes does.
func limited(data []byte, limit int64) io.Reader {
	return http.MaxBytesReader(nil, io.NopCloser(bytes.NewReader(data)), limit)
}

// sameRefusal describes how got differs from want, "" when they agree.
func sameRefusal(got, want error) string {
	if (got == nil) != (want == nil) {
		return "got " + errText(got) + ", the reference " + errText(want)
	}
	if got == nil {
		return ""
	}
	var g, w *problem.Error
	if !errors.As(got, &g) || !errors.As(want, &w) {
		return "not problems: " + errText(got) + " / " + errText(want)
	}
	if g.Status != w.Status || g.Code != w.Code || g.Detail != w.Detail {
		return "got " + errText(got) + ", the reference " + errText(want)
	}
	return ""
}

func errText(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// TestDecodeTakesTheQuickPath pins which bodies the quick path takes, and
// that decodeJSON takes it, so that a change making it refuse everything
// or skipping it (and so agreeing trivially with the reference) fails here.
func TestDecodeTakesTheQuickPath(t *testing.T) {
	names := fieldNames(reflect.TypeOf(checkpointBody{}))
	for _, c := range []struct {
		body  string
		quick bool
	}{
		{`{"owner":"w","token":1,"state":{"owner":1,"owner":2}}`, true}, // nested names are the state's own
		{` {"owner":"w\"}","token":2} `, true},
		{`{}`, true},
		{`{"owner":"w","owner":"v"}`, false},
		{`{"Owner":"w"}`, false},
		{`{"own\u0065r":"w"}`, false},
		{`{"finished":true}`, false},
		{`[{"owner":"w"}]`, false},
		{`"owner"`, false},
		{`null`, false},
		{`{"owner`, false}, // not JSON: never read past its end
		{`{"owner":"w\`, false},
	} {
		if got := namesAreFields([]byte(c.body), names); got != c.quick {
			t.Errorf("namesAreFields(%s) = %v, want %v", c.body, got, c.quick)
		}
	}
	// decodeJSON must use it: a decodeJSON that sent every body to the
	// reference would agree with it everywhere and pass the cases above.
	// The quick path is the only way decodeJSON can allocate less than the
	// reference (it reads the body whole first, then decodes it once), so
	// the allocation counts, taken in this run, tell the paths apart.
	const body = `{"owner":"worker-7","ttl_seconds":30}`
	allocs := func(decode func(io.Reader, int64, any) error) float64 {
		return testing.AllocsPerRun(50, func() {
			var dst acquireBody
			if err := decode(strings.NewReader(body), LeaseBodyLimit, &dst); err != nil || dst.Owner != "worker-7" {
				t.Fatalf("%q: %v, owner %q", body, err, dst.Owner)
			}
		})
	}
	if quick, stream := allocs(decodeJSON), allocs(decodeJSONStream); quick >= stream {
		t.Errorf("decodeJSON allocates %v times per body, the reference %v: the quick path is not taken", quick, stream)
	}
}

// BenchmarkDecodeBody compares decodeJSON with the reference decoder on
// an acquire's body, in one run.
func BenchmarkDecodeBody(b *testing.B) {
	const body = `{"owner":"worker-7","ttl_seconds":30}`
	for _, d := range []struct {
		name   string
		decode func(io.Reader, int64, any) error
	}{{"quick", decodeJSON}, {"stream", decodeJSONStream}} {
		b.Run(d.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var dst acquireBody
				if err := d.decode(strings.NewReader(body), LeaseBodyLimit, &dst); err != nil || dst.Owner != "worker-7" {
					b.Fatal(err)
				}
			}
		})
	}
}
