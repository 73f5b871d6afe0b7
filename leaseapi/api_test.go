package leaseapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
)

// TestLeaseLifecycle walks every row of the lease API table through its
// success and its listed failure, against each real store.
func TestLeaseLifecycle(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		start := e.clock.Now()

		// Unknown resource: 200 with zeros and nulls.
		st := e.get("/v1/leases/job:1")
		wantOK(t, "status unknown", st)
		if want := `{"resource":"job:1","issued_token":0,"high_water_token":0,"lease":null,"previous":null,"checkpoint":null}` + "\n"; string(st.raw) != want {
			t.Fatalf("status of unknown resource:\n got %s\nwant %s", st.raw, want)
		}
		wantProblem(t, "checkpoint unknown", e.get("/v1/leases/job:1/checkpoint"), 404, "no-checkpoint")

		// Acquire: token 1, default TTL, store-clock times.
		a := e.post("/v1/leases/job:1/acquire", `{"owner":"w1"}`)
		wantOK(t, "acquire", a)
		if a.str("resource") != "job:1" || a.str("owner") != "w1" || a.num("token") != 1 || a.num("ttl_seconds") != 30 {
			t.Fatalf("acquire: %s", a.raw)
		}
		if got := apiTime(t, "acquired_at", a.str("acquired_at")); !got.Equal(start) {
			t.Fatalf("acquired_at %v, want the store clock %v", got, start)
		}
		if got := apiTime(t, "expires_at", a.str("expires_at")); !got.Equal(start.Add(30 * time.Second)) {
			t.Fatalf("expires_at %v, want %v", got, start.Add(30*time.Second))
		}
		if len(a.body) != 6 {
			t.Fatalf("lease has members %v, want exactly resource, owner, token, ttl_seconds, acquired_at, expires_at", a.body)
		}

		// Same owner re-acquires: same token, extended.
		e.clock.Advance(5 * time.Second)
		a = e.post("/v1/leases/job:1/acquire", `{"owner":"w1","ttl_seconds":60}`)
		wantOK(t, "re-acquire", a)
		if a.num("token") != 1 || a.num("ttl_seconds") != 60 || !apiTime(t, "expires_at", a.str("expires_at")).Equal(start.Add(65*time.Second)) {
			t.Fatalf("re-acquire: %s", a.raw)
		}

		// Another owner: 409 lease-held with holder, expires_at, Retry-After.
		held := e.post("/v1/leases/job:1/acquire", `{"owner":"w2"}`)
		wantProblem(t, "acquire held", held, 409, "lease-held")
		if held.str("holder") != "w1" || held.str("expires_at") != a.str("expires_at") {
			t.Fatalf("lease-held members: %s", held.raw)
		}
		if ra := held.header.Get("Retry-After"); ra == "" || strings.Trim(ra, "0123456789") != "" {
			t.Fatalf("lease-held Retry-After %q", ra)
		}

		// Renew: holder ok; wrong token or owner: 409 lease-lost.
		r := e.post("/v1/leases/job:1/renew", `{"owner":"w1","token":1,"ttl_seconds":20}`)
		wantOK(t, "renew", r)
		if r.num("token") != 1 || r.num("ttl_seconds") != 20 || !apiTime(t, "expires_at", r.str("expires_at")).Equal(start.Add(25*time.Second)) {
			t.Fatalf("renew: %s", r.raw)
		}
		r = e.post("/v1/leases/job:1/renew", `{"owner":"w1","token":1}`)
		wantOK(t, "renew keeps ttl", r)
		if r.num("ttl_seconds") != 20 {
			t.Fatalf("renew without ttl_seconds changed the TTL: %s", r.raw)
		}
		wantProblem(t, "renew wrong token", e.post("/v1/leases/job:1/renew", `{"owner":"w1","token":2}`), 409, "lease-lost")
		wantProblem(t, "renew wrong owner", e.post("/v1/leases/job:1/renew", `{"owner":"w2","token":1}`), 409, "lease-lost")

		// Checkpoint: saves and renews; readable.
		e.clock.Advance(2 * time.Second)
		c := e.put("/v1/leases/job:1/checkpoint", `{"owner":"w1","token":1,"state":{"done":[1,2,3],"cursor":"abc"}}`)
		wantOK(t, "checkpoint", c)
		if c.num("token") != 1 || !apiTime(t, "expires_at", c.str("expires_at")).Equal(start.Add(27*time.Second)) {
			t.Fatalf("checkpoint did not renew by the TTL: %s", c.raw)
		}
		wantProblem(t, "checkpoint wrong token", e.put("/v1/leases/job:1/checkpoint", `{"owner":"w1","token":7,"state":1}`), 409, "lease-lost")
		rc := e.get("/v1/leases/job:1/checkpoint")
		wantOK(t, "read checkpoint", rc)
		if want := fmt.Sprintf(`{"state":{"done":[1,2,3],"cursor":"abc"},"token":1,"updated_at":%q,"previous":null}`+"\n", start.Add(7*time.Second).Format("2006-01-02T15:04:05.000Z")); string(rc.raw) != want {
			t.Fatalf("read checkpoint:\n got %s\nwant %s", rc.raw, want)
		}

		st = e.get("/v1/leases/job:1")
		wantOK(t, "status held", st)
		if st.num("issued_token") != 1 || st.obj("lease")["owner"] != "w1" || st.obj("checkpoint")["size_bytes"] == nil || st.body["previous"] != nil {
			t.Fatalf("status while held: %s", st.raw)
		}
		if cp := st.obj("checkpoint"); fmt.Sprint(cp["token"]) != "1" || fmt.Sprint(cp["size_bytes"]) != fmt.Sprint(len(`{"done":[1,2,3],"cursor":"abc"}`)) ||
			cp["updated_at"] != start.Add(7*time.Second).Format("2006-01-02T15:04:05.000Z") {
			t.Fatalf("status checkpoint: %s", st.raw)
		}

		// List: the live lease.
		l := e.get("/v1/leases")
		wantOK(t, "list", l)
		if !strings.Contains(string(l.raw), `"resource":"job:1"`) || !strings.HasPrefix(string(l.raw), `{"leases":[{`) {
			t.Fatalf("list: %s", l.raw)
		}

		// Release: wrong token lost; ok; repeated: false.
		wantProblem(t, "release wrong token", e.post("/v1/leases/job:1/release", `{"owner":"w1","token":3}`), 409, "lease-lost")
		rel := e.post("/v1/leases/job:1/release", `{"owner":"w1","token":1,"finished":true}`)
		wantOK(t, "release", rel)
		if string(rel.raw) != `{"released":true}`+"\n" {
			t.Fatalf("release: %s", rel.raw)
		}
		rel = e.post("/v1/leases/job:1/release", `{"owner":"w1","token":1}`)
		wantOK(t, "release again", rel)
		if string(rel.raw) != `{"released":false}`+"\n" {
			t.Fatalf("repeated release: %s", rel.raw)
		}
		wantProblem(t, "checkpoint after release", e.put("/v1/leases/job:1/checkpoint", `{"owner":"w1","token":1,"state":1}`), 409, "lease-lost")
		wantProblem(t, "renew after release", e.post("/v1/leases/job:1/renew", `{"owner":"w1","token":1}`), 409, "lease-lost")

		st = e.get("/v1/leases/job:1")
		if st.body["lease"] != nil || fmt.Sprint(st.obj("previous")) != "map[ended:released finished:true owner:w1 token:1]" {
			t.Fatalf("status after release: %s", st.raw)
		}
		if l := e.get("/v1/leases"); string(l.raw) != `{"leases":[],"next_cursor":null}`+"\n" {
			t.Fatalf("list after release: %s", l.raw)
		}

		// Next holder: token 2, sees the clean handoff.
		a = e.post("/v1/leases/job:1/acquire", `{"owner":"w2","ttl_seconds":10}`)
		wantOK(t, "acquire after release", a)
		if a.num("token") != 2 {
			t.Fatalf("acquire after release: %s", a.raw)
		}
		wantProblem(t, "old holder releases after newer token", e.post("/v1/leases/job:1/release", `{"owner":"w1","token":1}`), 409, "lease-lost")
		rc = e.get("/v1/leases/job:1/checkpoint")
		if fmt.Sprint(rc.obj("previous")) != "map[ended:released finished:true owner:w1 token:1]" || rc.num("token") != 1 {
			t.Fatalf("checkpoint seen by the next holder: %s", rc.raw)
		}

		// Expiry by the store's clock: renew refused, next holder sees a crash.
		e.clock.Advance(11 * time.Second)
		wantProblem(t, "renew expired", e.post("/v1/leases/job:1/renew", `{"owner":"w2","token":2}`), 409, "lease-lost")
		st = e.get("/v1/leases/job:1")
		if st.body["lease"] != nil || fmt.Sprint(st.obj("previous")) != "map[ended:expired finished:false owner:w2 token:2]" {
			t.Fatalf("status after expiry: %s", st.raw)
		}
		rel = e.post("/v1/leases/job:1/release", `{"owner":"w2","token":2}`)
		if string(rel.raw) != `{"released":false}`+"\n" {
			t.Fatalf("release of an expired lease, nothing newer: %s", rel.raw)
		}
		a = e.post("/v1/leases/job:1/acquire", `{"owner":"w3"}`)
		if a.num("token") != 3 {
			t.Fatalf("acquire after expiry: %s", a.raw)
		}
		if p := e.get("/v1/leases/job:1/checkpoint").obj("previous"); fmt.Sprint(p) != "map[ended:expired finished:false owner:w2 token:2]" {
			t.Fatalf("previous after expiry: %v", p)
		}
	})
}

// TestList checks prefix and limit.
func TestList(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		for _, r := range []string{"job:3", "job:1", "mail:1", "job:2"} {
			wantOK(t, "acquire "+r, e.post("/v1/leases/"+r+"/acquire", `{"owner":"w"}`))
		}
		names := func(a answer) string {
			var out []string
			for _, l := range a.body["leases"].([]any) {
				out = append(out, l.(map[string]any)["resource"].(string))
			}
			return strings.Join(out, ",")
		}
		for _, c := range []struct{ query, want string }{
			{"", "job:1,job:2,job:3,mail:1"},
			{"?prefix=job:", "job:1,job:2,job:3"},
			{"?prefix=job:&limit=2", "job:1,job:2"},
			{"?limit=1", "job:1"},
			{"?prefix=none", ""},
			{"?limit=", "job:1,job:2,job:3,mail:1"},
		} {
			a := e.get("/v1/leases" + c.query)
			wantOK(t, "list"+c.query, a)
			if got := names(a); got != c.want {
				t.Errorf("list%s = %q, want %q", c.query, got, c.want)
			}
		}
	})
}

// TestResourceNames checks that every allowed character survives the path,
// and that a percent-encoded name is the same resource.
func TestResourceNames(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		for _, name := range []string{"job:1", "a.b~c-d_e", "X", strings.Repeat("z", 200)} {
			a := e.post("/v1/leases/"+name+"/acquire", `{"owner":"w"}`)
			wantOK(t, "acquire "+name, a)
			if a.str("resource") != name {
				t.Fatalf("resource %q answered as %q", name, a.str("resource"))
			}
			if st := e.get("/v1/leases/" + name); st.str("resource") != name || st.obj("lease") == nil {
				t.Fatalf("status of %q: %s", name, st.raw)
			}
		}
		st := e.get("/v1/leases/job%3A1")
		wantOK(t, "encoded name", st)
		if st.str("resource") != "job:1" || st.num("issued_token") != 1 {
			t.Fatalf("job%%3A1 is not job:1: %s", st.raw)
		}
		if a := e.post("/v1/leases/job%3a1/acquire", `{"owner":"w"}`); a.num("token") != 1 {
			t.Fatalf("encoded re-acquire: %s", a.raw)
		}
	})
}

// TestStoreFault checks fail-closed answers when the store cannot answer.
func TestStoreFault(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		if err := e.store.Close(); err != nil {
			t.Fatal(err)
		}
		a := e.post("/v1/leases/job:1/acquire", `{"owner":"w"}`)
		wantProblem(t, "acquire on closed store", a, 503, "store-unavailable")
		if a.header.Get("Retry-After") == "" {
			t.Fatal("store-unavailable without Retry-After")
		}
		wantProblem(t, "readyz on closed store", e.get("/readyz"), 503, "store-unavailable")
		if e.get("/livez").status != http.StatusOK {
			t.Fatal("livez depends on the store")
		}
	})
}

// TestStatusTokens checks that status reports the issued token and the
// high-water mark each from its own source: after an admission of an older
// token they differ, so a swapped or copied member shows.
func TestStatusTokens(t *testing.T) {
	forEachStore(t, func(t *testing.T, k storeKind) {
		e := newEnv(t, k, nil)
		wantOK(t, "acquire w1", e.post("/v1/leases/job:1/acquire", `{"owner":"w1"}`))
		wantOK(t, "release w1", e.post("/v1/leases/job:1/release", `{"owner":"w1","token":1}`))
		wantOK(t, "acquire w2", e.post("/v1/leases/job:1/acquire", `{"owner":"w2"}`))
		if _, err := e.store.Admit(context.Background(), fencing.AdmitRequest{Resource: "job:1", Token: 1}); err != nil {
			t.Fatal(err)
		}
		st := e.get("/v1/leases/job:1")
		wantOK(t, "status", st)
		if st.num("issued_token") != 2 || st.num("high_water_token") != 1 {
			t.Fatalf("status after admitting token 1 of 2: %s", st.raw)
		}
	})
}
