package reqid

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestMiddleware(t *testing.T) {
	var seen string
	h := Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = From(r) }))
	cases := []struct {
		in       string
		keepsOwn bool
	}{
		{"abc-123", true},
		{"", false},
		{strings.Repeat("x", MaxBytes+1), false},
		{"bad id", false},
		{"bad\x01id", false},
	}
	for _, tc := range cases {
		req := httptest.NewRequest("PUT", "/x", nil)
		if tc.in != "" {
			req.Header.Set(Header, tc.in)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		echoed := rec.Header().Get(Header)
		if seen == "" || echoed != seen {
			t.Errorf("%q: context id %q, echoed %q", tc.in, seen, echoed)
		}
		if (seen == tc.in) != tc.keepsOwn {
			t.Errorf("%q: got id %q; keep the client's id = %v", tc.in, seen, tc.keepsOwn)
		}
	}
}

func TestChoose(t *testing.T) {
	if got := Choose([]byte("abc-123")); got != "abc-123" {
		t.Fatalf("a sane client id: %q", got)
	}
	a, b := Choose(nil), Choose([]byte("bad id"))
	if a == b || !strings.HasPrefix(a, prefix+"-") || !strings.HasPrefix(b, prefix+"-") {
		t.Fatalf("generated ids %q, %q: want distinct, prefixed %q", a, b, prefix)
	}
	if n := len(a) - len(prefix) - 1; n < 6 {
		t.Fatalf("generated id %q: sequence shorter than 6 digits", a)
	}
}
