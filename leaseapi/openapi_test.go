package leaseapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/schema_validation"

	"github.com/fencegate/fencegate/leaseapi"
	"github.com/fencegate/fencegate/leaseapi/access"
)

// openAPIValidator loads the embedded document with a maintained OpenAPI
// 3.1 library and checks the document itself against the specification.
func openAPIValidator(t *testing.T) (validator.Validator, libopenapi.Document) {
	t.Helper()
	doc, err := libopenapi.NewDocument(leaseapi.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("document: %s: %s", e.Message, e.Reason)
		}
		t.FailNow()
	}
	return v, doc
}

// apiCase is one real request and the answer it must get.
type apiCase struct {
	name        string
	env         string // which server: "" plain, "auth", "closed" (store closed), "panic"
	method      string
	path        string
	contentType string
	body        string
	status      int
	code        string // problem code; empty for success
}

// TestOpenAPIMatchesHandlers sends a real request to every endpoint, and
// provokes every problem code the API answers, through the real handlers
// over a real store; every answer (status, headers, body) must validate
// against the document, and every valid request too. The codes provoked
// must be exactly the codes the document lists.
func TestOpenAPIMatchesHandlers(t *testing.T) {
	v, doc := openAPIValidator(t)
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatal(err)
	}
	genericProblem := func(name string) func([]byte) []string {
		schema := model.Model.Components.Responses.GetOrZero(name).Content.GetOrZero("application/problem+json").Schema.Schema()
		return func(body []byte) []string {
			ok, errs := schema_validation.NewSchemaValidator().ValidateSchemaBytes(schema, body)
			if ok {
				return nil
			}
			var out []string
			for _, e := range errs {
				out = append(out, describeValidation(e.Message, e.Reason, e.SchemaValidationErrors))
			}
			return out
		}
	}
	notFound, notAllowed := genericProblem("NotFound"), genericProblem("MethodNotAllowed")

	envs := map[string]*env{
		"": newEnv(t, storeKinds[0], func(o *leaseapi.Options) {
			o.Metrics = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				io.WriteString(w, "# metrics\n")
			})
		}),
		"auth":   newEnv(t, storeKinds[0], func(o *leaseapi.Options) { o.AuthToken = "tok" }),
		"closed": newEnv(t, storeKinds[0], nil),
	}
	if err := envs["closed"].store.Close(); err != nil {
		t.Fatal(err)
	}
	envs["access"] = newAccessEnv(t) // requests sent as pool-b
	limited := newAccessEnv(t)
	lim := access.NewLimiter(1, time.Hour, nil)
	lim.Fail("127.0.0.1")
	leaseapi.SetLimiter(limited.api, lim)
	envs["limited"] = limited
	draining := newEnv(t, storeKinds[0], nil)
	draining.api.SetDraining()
	envs["draining"] = draining
	// A budget of one checkpoint body, held by a call stalled before its
	// body's end: any other body is refused.
	overloaded := newEnv(t, storeKinds[0], func(o *leaseapi.Options) { o.BodyMemory = 1 })
	budget, _ := leaseapi.BodyBudget(overloaded.api)
	stallHTTP1(t, overloaded.srv.Listener.Addr().String(), 1, "/v1/leases/job:1/checkpoint", make([]byte, budget))
	awaitHeld(t, overloaded.api, budget)
	envs["overloaded"] = overloaded
	panicking, spy := newSpyEnv(t, storeKinds[0])
	spy.panic.Store(true)
	envs["panic"] = panicking

	const js = "application/json"
	big := `{"owner":"w1","token":1,"state":"` + strings.Repeat("x", testMaxCheckpoint) + `"}`
	cases := []apiCase{
		{"livez", "", "GET", "/livez", "", "", 200, ""},
		{"readyz", "", "GET", "/readyz", "", "", 200, ""},
		{"metrics", "", "GET", "/metrics", "", "", 200, ""},
		{"openapi", "", "GET", "/openapi.json", "", "", 200, ""},
		{"status of an unknown resource", "", "GET", "/v1/leases/job:1", "", "", 200, ""},
		{"list, empty", "", "GET", "/v1/leases", "", "", 200, ""},
		{"acquire", "", "POST", "/v1/leases/job:1/acquire", js, `{"owner":"w1","ttl_seconds":30}`, 200, ""},
		{"acquire, held", "", "POST", "/v1/leases/job:1/acquire", js, `{"owner":"w2","wait_seconds":0}`, 409, "lease-held"},
		{"renew", "", "POST", "/v1/leases/job:1/renew", js, `{"owner":"w1","token":1,"ttl_seconds":20}`, 200, ""},
		{"renew, wrong token", "", "POST", "/v1/leases/job:1/renew", js, `{"owner":"w1","token":7}`, 409, "lease-lost"},
		{"read checkpoint, none", "", "GET", "/v1/leases/job:1/checkpoint", "", "", 404, "no-checkpoint"},
		{"checkpoint", "", "PUT", "/v1/leases/job:1/checkpoint", js, `{"owner":"w1","token":1,"state":{"done":[1,2]}}`, 200, ""},
		{"checkpoint, too large", "", "PUT", "/v1/leases/job:1/checkpoint", js, big, 413, "payload-too-large"},
		{"checkpoint, wrong owner", "", "PUT", "/v1/leases/job:1/checkpoint", js, `{"owner":"w2","token":1,"state":1}`, 409, "lease-lost"},
		{"read checkpoint", "", "GET", "/v1/leases/job:1/checkpoint", "", "", 200, ""},
		{"status, leased", "", "GET", "/v1/leases/job:1", "", "", 200, ""},
		{"list", "", "GET", "/v1/leases?prefix=job:&limit=10", "", "", 200, ""},
		{"list, a full page", "", "GET", "/v1/leases?prefix=job:&limit=1", "", "", 200, ""},
		{"list, the next page", "", "GET", "/v1/leases?prefix=job:&limit=1&cursor=am9iOjE", "", "", 200, ""},
		{"list, a cursor never given", "", "GET", "/v1/leases?cursor=bm90IGEgbmFtZQ", "", "", 400, "invalid-request"},
		{"release", "", "POST", "/v1/leases/job:1/release", js, `{"owner":"w1","token":1,"finished":true}`, 200, ""},
		{"release again", "", "POST", "/v1/leases/job:1/release", js, `{"owner":"w1","token":1}`, 200, ""},
		{"status, released", "", "GET", "/v1/leases/job:1", "", "", 200, ""},
		{"read checkpoint, previous", "", "GET", "/v1/leases/job:1/checkpoint", "", "", 200, ""},
		{"acquire, next holder", "", "POST", "/v1/leases/job:1/acquire", js, `{"owner":"w2"}`, 200, ""},
		{"release, stale token", "", "POST", "/v1/leases/job:1/release", js, `{"owner":"w1","token":1}`, 409, "lease-lost"},
		{"acquire, bad JSON", "", "POST", "/v1/leases/job:2/acquire", js, `{"owner":`, 400, "invalid-json"},
		{"acquire, TTL out of bounds", "", "POST", "/v1/leases/job:2/acquire", js, `{"owner":"w","ttl_seconds":0}`, 400, "invalid-request"},
		{"acquire, unknown member", "", "POST", "/v1/leases/job:2/acquire", js, `{"owner":"w","ttl":5}`, 400, "invalid-request"},
		{"acquire, bad resource", "", "POST", "/v1/leases/job%2F2/acquire", js, `{"owner":"w"}`, 400, "invalid-request"},
		{"acquire, not JSON", "", "POST", "/v1/leases/job:2/acquire", "text/plain", `owner=w`, 415, "unsupported-media-type"},
		{"list, bad limit", "", "GET", "/v1/leases?limit=0", "", "", 400, "invalid-request"},
		{"no credentials", "auth", "GET", "/v1/leases", "", "", 401, "unauthorized"},
		{"outside the client's prefixes", "access", "POST", "/v1/leases/job:a:1/acquire", js, `{"owner":"pool-b"}`, 403, "forbidden"},
		{"another client's owner", "access", "POST", "/v1/leases/job:b:1/acquire", js, `{"owner":"pool-a"}`, 403, "forbidden"},
		{"failed authentications spent", "limited", "GET", "/v1/leases", "", "", 429, "too-many-requests"},
		{"store closed", "closed", "POST", "/v1/leases/job:1/acquire", js, `{"owner":"w"}`, 503, "store-unavailable"},
		{"body budget spent", "overloaded", "POST", "/v1/leases/job:1/acquire", js, `{"owner":"w"}`, 503, "overloaded"},
		{"store closed, status", "closed", "GET", "/v1/leases/job:1", "", "", 503, "store-unavailable"},
		{"store closed, readyz", "closed", "GET", "/readyz", "", "", 503, "store-unavailable"},
		{"draining", "draining", "GET", "/readyz", "", "", 503, "draining"},
		{"internal error", "panic", "POST", "/v1/leases/job:1/acquire", js, `{"owner":"w"}`, 500, "internal-error"},
		{"unknown path", "", "GET", "/v2/leases", "", "", 404, "not-found"},
		{"wrong method", "", "DELETE", "/v1/leases/job:1/acquire", "", "", 405, "method-not-allowed"},
	}
	provoked := map[string]bool{}
	for _, c := range cases {
		e := envs[c.env]
		req := func() *http.Request {
			var rd io.Reader
			if c.body != "" {
				rd = strings.NewReader(c.body)
			}
			r, err := http.NewRequest(c.method, e.srv.URL+c.path, rd)
			if err != nil {
				t.Fatal(err)
			}
			if c.contentType != "" {
				r.Header.Set("Content-Type", c.contentType)
			}
			if c.env == "access" {
				r.Header.Set("Authorization", "Bearer tok-b")
			}
			return r
		}
		resp, err := e.srv.Client().Do(req())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("%s: status %d, want %d: %s", c.name, resp.StatusCode, c.status, raw)
		}
		if c.code != "" {
			var p struct{ Code string }
			if json.Unmarshal(raw, &p); p.Code != c.code {
				t.Fatalf("%s: code %q, want %q: %s", c.name, p.Code, c.code, raw)
			}
			provoked[c.code] = true
		}
		var problems []string
		switch c.code {
		case "not-found":
			problems = notFound(raw)
		case "method-not-allowed":
			problems = notAllowed(raw)
		default:
			resp.Body = io.NopCloser(bytes.NewReader(raw))
			if ok, errs := v.ValidateHttpResponse(req(), resp); !ok {
				for _, e := range errs {
					problems = append(problems, describeValidation(e.Message, e.Reason, e.SchemaValidationErrors))
				}
			}
			if c.status == 200 {
				if ok, errs := v.ValidateHttpRequestSync(req()); !ok {
					for _, e := range errs {
						problems = append(problems, "request: "+describeValidation(e.Message, e.Reason, e.SchemaValidationErrors))
					}
				}
			}
		}
		if len(problems) > 0 {
			t.Errorf("%s: %s %s answered %d %s\ndoes not match openapi.json:\n  %s", c.name, c.method, c.path, resp.StatusCode, raw, strings.Join(problems, "\n  "))
		}
	}

	var listed struct {
		Components struct {
			Schemas struct {
				ProblemCode struct {
					OneOf []struct{ Const string }
				}
			}
		}
	}
	if err := json.Unmarshal(leaseapi.OpenAPI(), &listed); err != nil {
		t.Fatal(err)
	}
	var documented, seen []string
	for _, c := range listed.Components.Schemas.ProblemCode.OneOf {
		documented = append(documented, c.Const)
	}
	for c := range provoked {
		seen = append(seen, c)
	}
	sort.Strings(documented)
	sort.Strings(seen)
	if !slices.Equal(documented, seen) {
		t.Errorf("problem codes documented %v, provoked %v", documented, seen)
	}
}

// describeValidation renders a validation error with its schema failures.
func describeValidation[F any](msg, reason string, failures []F) string {
	s := msg
	if reason != "" {
		s += ": " + reason
	}
	for _, f := range failures {
		s += fmt.Sprintf("\n    %+v", f)
	}
	return s
}

// TestOpenAPIListsEveryRoute checks that the document describes exactly
// the routes the router serves: no undocumented endpoint, no documented
// endpoint that does not exist.
func TestOpenAPIListsEveryRoute(t *testing.T) {
	openAPIValidator(t)
	var doc struct {
		Paths map[string]map[string]json.RawMessage
	}
	if err := json.Unmarshal(leaseapi.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	var documented []string
	for path, item := range doc.Paths {
		for method := range item {
			if method == "parameters" || method == "summary" || method == "description" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	s := leaseapi.NewServer(leaseapi.Options{Store: newSessionEnv(t).store, Metrics: http.NotFoundHandler()})
	var served []string
	err := chi.Walk(leaseapi.Routes(s), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		served = append(served, method+" "+strings.TrimSuffix(route, "/"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(documented)
	sort.Strings(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("routes served:\n  %s\nroutes documented:\n  %s", strings.Join(served, "\n  "), strings.Join(documented, "\n  "))
	}
}

// The document is served as is on the API listener, without credentials.
func TestOpenAPIServed(t *testing.T) {
	e := newEnv(t, storeKinds[0], func(o *leaseapi.Options) { o.AuthToken = "tok" })
	resp, err := e.srv.Client().Get(e.srv.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || !bytes.Equal(raw, leaseapi.OpenAPI()) {
		t.Fatalf("GET /openapi.json: %d %s, %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), len(raw))
	}
	var v struct{ OpenAPI string }
	if err := json.Unmarshal(raw, &v); err != nil || v.OpenAPI != "3.1.0" {
		t.Fatalf("not an OpenAPI 3.1 document: %q %v", v.OpenAPI, err)
	}
}
