package leaseapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/fencegate/fencegate/fencing/problem"
)

// FuzzDecodeBody feeds arbitrary bytes to the request decoder. It must
// never panic, must refuse with a 400 or 413 problem naming one of the
// decoder's codes, and whatever it accepts must survive re-encoding
// unchanged (so the handler sees exactly what the client meant).
func FuzzDecodeBody(f *testing.F) {
	for _, seed := range []string{
		`{"owner":"w","ttl_seconds":30,"wait_seconds":5}`,
		`{"owner":"w","token":1,"state":{"a":[1,2]}}`,
		`{"owner":"w","token":18446744073709551615,"finished":true}`,
		`{"owner":`, `[]`, `null`, `{"x":1}`, `{} {}`, `{"ttl_seconds":1e3}`, `{"token":-1}`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, dst := range []any{&acquireBody{}, &renewBody{}, &releaseBody{}, &checkpointBody{}} {
			err := decodeJSON(bytes.NewReader(data), LeaseBodyLimit, dst)
			if err != nil {
				var p *problem.Error
				if !errors.As(err, &p) || (p.Status != http.StatusBadRequest && p.Status != http.StatusRequestEntityTooLarge) {
					t.Fatalf("%q: refusal %v is not a 400/413 problem", data, err)
				}
				switch p.Code {
				case "invalid-json", "invalid-request", "payload-too-large":
				default:
					t.Fatalf("%q: unexpected code %q", data, p.Code)
				}
				continue
			}
			again, err := json.Marshal(dst)
			if err != nil {
				t.Fatalf("%q: re-encode: %v", data, err)
			}
			fresh := newLike(dst)
			if err := decodeJSON(bytes.NewReader(again), LeaseBodyLimit, fresh); err != nil {
				t.Fatalf("%q: re-encoded %s refused: %v", data, again, err)
			}
			if twice, _ := json.Marshal(fresh); !bytes.Equal(twice, again) {
				t.Fatalf("%q: round trip changed %s into %s", data, again, twice)
			}
		}
	})
}

func newLike(v any) any {
	switch v.(type) {
	case *acquireBody:
		return &acquireBody{}
	case *renewBody:
		return &renewBody{}
	case *releaseBody:
		return &releaseBody{}
	}
	return &checkpointBody{}
}
