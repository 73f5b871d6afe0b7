package leaseapi_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestBadInputChangesNothing sends every kind of bad request and checks the
// exact problem, then that the store is untouched: status, checkpoint and
// list read back byte for byte as before (the fake clock stands still).
func TestBadInputChangesNothing(t *testing.T) {
	big := strings.Repeat("x", 70<<10)
	bigState := `"` + strings.Repeat("s", 2000) + `"`    // above the store limit, within the body limit
	hugeState := `"` + strings.Repeat("s", 80<<10) + `"` // above the body limit
	cases := []struct {
		name, method, path, ctype, body string
		status                          int
		code                            string
	}{
		// Resource names.
		{"bad char", "POST", "/v1/leases/bad$name/acquire", "application/json", `{"owner":"w9"}`, 400, "invalid-request"},
		{"encoded slash", "POST", "/v1/leases/a%2Fb/acquire", "application/json", `{"owner":"w9"}`, 400, "invalid-request"},
		{"encoded space", "GET", "/v1/leases/a%20b", "", "", 400, "invalid-request"},
		{"name too long", "POST", "/v1/leases/" + strings.Repeat("n", 201) + "/acquire", "application/json", `{"owner":"w9"}`, 400, "invalid-request"},
		{"checkpoint bad name", "PUT", "/v1/leases/bad$/checkpoint", "application/json", `{"owner":"w1","token":1,"state":1}`, 400, "invalid-request"},
		// Decoded once, as a proxy in front decodes it: job:%41, not job:A.
		{"encoded percent", "POST", "/v1/leases/job:%2541/acquire", "application/json", `{"owner":"w9"}`, 400, "invalid-request"},
		{"encoded percent, status", "GET", "/v1/leases/job%253A1", "", "", 400, "invalid-request"},
		{"encoded percent beside an escape", "GET", "/v1/leases/job:%2541%2D", "", "", 400, "invalid-request"},
		// Query parameters: the calls on one resource take none.
		{"query on acquire", "POST", "/v1/leases/job:2/acquire?ttl_seconds=5", "application/json", `{"owner":"w9"}`, 400, "invalid-request"},
		{"query on status", "GET", "/v1/leases/job:1?verbose=1", "", "", 400, "invalid-request"},
		{"query on checkpoint", "PUT", "/v1/leases/job:1/checkpoint?x", "application/json", `{"owner":"w1","token":1,"state":2}`, 400, "invalid-request"},
		// ttl_seconds and wait_seconds.
		{"ttl 0", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","ttl_seconds":0}`, 400, "invalid-request"},
		{"ttl 86401", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","ttl_seconds":86401}`, 400, "invalid-request"},
		{"ttl negative", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","ttl_seconds":-5}`, 400, "invalid-request"},
		{"ttl huge", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","ttl_seconds":9223372036854775807}`, 400, "invalid-request"},
		{"ttl overflow", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","ttl_seconds":18446744073709551617}`, 400, "invalid-request"},
		{"ttl fraction", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","ttl_seconds":1.5}`, 400, "invalid-request"},
		{"ttl string", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","ttl_seconds":"30"}`, 400, "invalid-request"},
		{"wait 61", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","wait_seconds":61}`, 400, "invalid-request"},
		{"wait negative", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","wait_seconds":-1}`, 400, "invalid-request"},
		{"renew ttl 0", "POST", "/v1/leases/job:1/renew", "application/json", `{"owner":"w1","token":1,"ttl_seconds":0}`, 400, "invalid-request"},
		{"renew ttl 86401", "POST", "/v1/leases/job:1/renew", "application/json", `{"owner":"w1","token":1,"ttl_seconds":86401}`, 400, "invalid-request"},
		// Owners and tokens.
		{"missing owner", "POST", "/v1/leases/job:2/acquire", "application/json", `{"ttl_seconds":30}`, 400, "invalid-request"},
		{"empty owner", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":""}`, 400, "invalid-request"},
		{"owner control char", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w\n9"}`, 400, "invalid-request"},
		{"owner too long", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"` + strings.Repeat("o", 201) + `"}`, 400, "invalid-request"},
		{"owner not string", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":7}`, 400, "invalid-request"},
		{"renew token 0", "POST", "/v1/leases/job:1/renew", "application/json", `{"owner":"w1","token":0}`, 400, "invalid-request"},
		{"renew missing token", "POST", "/v1/leases/job:1/renew", "application/json", `{"owner":"w1"}`, 400, "invalid-request"},
		{"renew token negative", "POST", "/v1/leases/job:1/renew", "application/json", `{"owner":"w1","token":-1}`, 400, "invalid-request"},
		{"renew token string", "POST", "/v1/leases/job:1/renew", "application/json", `{"owner":"w1","token":"1"}`, 400, "invalid-request"},
		{"release token 0", "POST", "/v1/leases/job:1/release", "application/json", `{"owner":"w1","token":0}`, 400, "invalid-request"},
		{"release finished not bool", "POST", "/v1/leases/job:1/release", "application/json", `{"owner":"w1","token":1,"finished":"yes"}`, 400, "invalid-request"},
		{"checkpoint missing state", "PUT", "/v1/leases/job:1/checkpoint", "application/json", `{"owner":"w1","token":1}`, 400, "invalid-request"},
		{"checkpoint null state", "PUT", "/v1/leases/job:1/checkpoint", "application/json", `{"owner":"w1","token":1,"state":null}`, 400, "invalid-request"},
		{"checkpoint token 0", "PUT", "/v1/leases/job:1/checkpoint", "application/json", `{"owner":"w1","token":0,"state":1}`, 400, "invalid-request"},
		// Malformed and unexpected JSON.
		{"truncated", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":`, 400, "invalid-json"},
		{"syntax", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner" "w9"}`, 400, "invalid-json"},
		{"two values", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9"} {"owner":"w8"}`, 400, "invalid-json"},
		{"trailing garbage", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9"}x`, 400, "invalid-json"},
		{"array", "POST", "/v1/leases/job:2/acquire", "application/json", `[{"owner":"w9"}]`, 400, "invalid-json"},
		{"string body", "POST", "/v1/leases/job:2/acquire", "application/json", `"w9"`, 400, "invalid-json"},
		{"empty body", "POST", "/v1/leases/job:2/acquire", "application/json", ``, 400, "invalid-json"},
		{"empty body no type", "POST", "/v1/leases/job:2/acquire", "", ``, 400, "invalid-json"},
		{"unknown member", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","tll_seconds":30}`, 400, "invalid-request"},
		{"member name in another case", "POST", "/v1/leases/job:2/acquire", "application/json", `{"Owner":"w9"}`, 400, "invalid-request"},
		{"repeated member", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9","owner":"w8"}`, 400, "invalid-request"},
		{"null body", "POST", "/v1/leases/job:2/acquire", "application/json", `null`, 400, "invalid-json"},
		{"unknown member renew", "POST", "/v1/leases/job:1/renew", "application/json", `{"owner":"w1","token":1,"finished":true}`, 400, "invalid-request"},
		{"checkpoint state not UTF-8", "PUT", "/v1/leases/job:1/checkpoint", "application/json", "{\"owner\":\"w1\",\"token\":1,\"state\":\"\xff\xfe\"}", 400, "invalid-request"},
		{"checkpoint bad state", "PUT", "/v1/leases/job:1/checkpoint", "application/json", `{"owner":"w1","token":1,"state":{"a":}}`, 400, "invalid-json"},
		// Media types.
		{"text/plain", "POST", "/v1/leases/job:2/acquire", "text/plain", `{"owner":"w9"}`, 415, "unsupported-media-type"},
		{"curl -d default", "POST", "/v1/leases/job:2/acquire", "application/x-www-form-urlencoded", `{"owner":"w9"}`, 415, "unsupported-media-type"},
		{"no content type", "POST", "/v1/leases/job:2/acquire", "", `{"owner":"w9"}`, 415, "unsupported-media-type"},
		{"latin1 charset", "POST", "/v1/leases/job:2/acquire", "application/json; charset=iso-8859-1", `{"owner":"w9"}`, 415, "unsupported-media-type"},
		{"checkpoint text", "PUT", "/v1/leases/job:1/checkpoint", "text/plain", `{"owner":"w1","token":1,"state":1}`, 415, "unsupported-media-type"},
		// Sizes.
		{"lease body too large", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"` + big + `"}`, 413, "payload-too-large"},
		{"lease body too large by whitespace", "POST", "/v1/leases/job:2/acquire", "application/json", `{"owner":"w9"}` + strings.Repeat(" ", 70<<10), 413, "payload-too-large"},
		{"state above store limit", "PUT", "/v1/leases/job:1/checkpoint", "application/json", `{"owner":"w1","token":1,"state":` + bigState + `}`, 413, "payload-too-large"},
		{"checkpoint body too large", "PUT", "/v1/leases/job:1/checkpoint", "application/json", `{"owner":"w1","token":1,"state":` + hugeState + `}`, 413, "payload-too-large"},
		// List query.
		{"limit 0", "GET", "/v1/leases?limit=0", "", "", 400, "invalid-request"},
		{"limit 1001", "GET", "/v1/leases?limit=1001", "", "", 400, "invalid-request"},
		{"limit word", "GET", "/v1/leases?limit=ten", "", "", 400, "invalid-request"},
		{"limit negative", "GET", "/v1/leases?limit=-1", "", "", 400, "invalid-request"},
		{"bad prefix", "GET", "/v1/leases?prefix=a/b", "", "", 400, "invalid-request"},
		{"unknown query parameter", "GET", "/v1/leases?prefx=job:", "", "", 400, "invalid-request"},
		{"malformed query pair", "GET", "/v1/leases?prefix=%ZZ", "", "", 400, "invalid-request"},
		{"semicolon in query", "GET", "/v1/leases?prefix=job:;x", "", "", 400, "invalid-request"},
		{"repeated query parameter", "GET", "/v1/leases?prefix=job:&prefix=mail:", "", "", 400, "invalid-request"},
		{"malformed limit pair", "GET", "/v1/leases?limit=%ZZ", "", "", 400, "invalid-request"},
		{"cursor not base64url", "GET", "/v1/leases?cursor=!!", "", "", 400, "invalid-request"},
		{"cursor of no resource name", "GET", "/v1/leases?cursor=bm90IGEgbmFtZQ", "", "", 400, "invalid-request"},
	}
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		wantOK(t, "acquire", e.post("/v1/leases/job:1/acquire", `{"owner":"w1"}`))
		wantOK(t, "checkpoint", e.put("/v1/leases/job:1/checkpoint", `{"owner":"w1","token":1,"state":{"n":1}}`))
		snapshot := func() []byte {
			var b bytes.Buffer
			for _, p := range []string{"/v1/leases/job:1", "/v1/leases/job:1/checkpoint", "/v1/leases/job:2", "/v1/leases"} {
				a := e.get(p)
				b.WriteString(p + " ")
				b.Write(a.raw)
			}
			return b.Bytes()
		}
		before := snapshot()
		for _, c := range cases {
			a := e.req(c.method, c.path, c.ctype, c.body)
			wantProblem(t, c.name, a, c.status, c.code)
			if after := snapshot(); !bytes.Equal(before, after) {
				t.Fatalf("%s changed the store:\nbefore %s\nafter  %s", c.name, before, after)
			}
		}
		// Two Content-Type headers, even both JSON: Content-Type is a
		// singleton field, and which one counts would depend on who reads it.
		for _, types := range [][2]string{{"application/json", "text/plain"}, {"text/plain", "application/json"}, {"application/json", "application/json"}} {
			name := "Content-Type " + types[0] + " and " + types[1]
			a := e.req(http.MethodPost, "/v1/leases/job:2/acquire", types[0], `{"owner":"w9"}`, "Content-Type", types[1])
			wantProblem(t, name, a, http.StatusUnsupportedMediaType, "unsupported-media-type")
			if after := snapshot(); !bytes.Equal(before, after) {
				t.Fatalf("%s changed the store:\nbefore %s\nafter  %s", name, before, after)
			}
		}
		// The detail names the offending field.
		for _, c := range []struct{ body, field string }{
			{`{"owner":"w9","ttl_seconds":0}`, "ttl_seconds"},
			{`{"owner":"w9","wait_seconds":99}`, "wait_seconds"},
			{`{"owner":"w9","ttl_seconds":"30"}`, "ttl_seconds"},
			{`{"ttl_seconds":30}`, "owner"},
			{`{"owner":"w9","tll_seconds":30}`, `"tll_seconds"`},
		} {
			if d := e.post("/v1/leases/job:2/acquire", c.body).str("detail"); !strings.Contains(d, c.field) {
				t.Errorf("%s: detail %q does not name %s", c.body, d, c.field)
			}
		}
		if got := e.req(http.MethodPost, "/v1/leases/job:2/acquire", "application/json; charset=UTF-8", `{"owner":"w9"}`); got.status != http.StatusOK {
			t.Fatalf("application/json; charset=UTF-8 refused: %s", got.raw)
		}
	})
}
