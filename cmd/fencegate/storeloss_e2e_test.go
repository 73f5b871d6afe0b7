package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFileStoreLoss loses the store file between two runs of the binary
// (deleted, replaced by another store's file, restored from an older copy)
// and checks the promise through the gate: the next token is above every
// token issued before the loss, and no pre-loss token reaches the upstream,
// before or after a post-loss write.
func TestFileStoreLoss(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, db, backup string)
	}{
		{"deleted", func(t *testing.T, db, _ string) {
			if err := os.Remove(db); err != nil {
				t.Fatal(err)
			}
		}},
		{"replaced", func(t *testing.T, db, _ string) {
			// Another deployment's store file, with its own small tokens.
			other := t.TempDir()
			p := start(t, other, []string{"FENCEGATE_STORE=file:other.db"}, "api")
			if st, _, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"elsewhere"}`); st != 200 {
				t.Fatalf("acquire on the other store: %d", st)
			}
			if err := p.stop(); err != nil {
				t.Fatal(err)
			}
			copyE2E(t, filepath.Join(other, "other.db"), db)
		}},
		{"restored from an older copy", func(t *testing.T, db, backup string) { copyE2E(t, backup, db) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			upstream := httptest.NewServer(rec)
			defer upstream.Close()
			dir := t.TempDir()
			db := filepath.Join(dir, "fencegate.db")
			env := []string{"FENCEGATE_UPSTREAM=" + upstream.URL, "FENCEGATE_RULES=PUT /jobs/{id} fence job:{id}"}
			write := func(p *proc, tok int64, by string) (int, map[string]any) {
				st, body, _ := call(t, "PUT", p.url("gate", "/jobs/1"), map[string]string{"Fencing-Token": strconv.FormatInt(tok, 10)}, `{"by":"`+by+`"}`)
				return st, body
			}

			p := start(t, dir, env, "api", "gate")
			_, a, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"a","ttl_seconds":600}`)
			tokA := token(t, a)
			if st, _ := write(p, tokA, "a"); st != 200 {
				t.Fatalf("A's write: %d", st)
			}
			if err := p.stop(); err != nil {
				t.Fatal(err)
			}
			backup := filepath.Join(t.TempDir(), "backup.db")
			copyE2E(t, db, backup)

			p = start(t, dir, env, "api", "gate")
			if st, _, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/release"), nil, fmt.Sprintf(`{"owner":"a","token":%d}`, tokA)); st != 200 {
				t.Fatalf("A's release: %d", st)
			}
			_, b, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"b","ttl_seconds":600}`)
			tokB := token(t, b)
			if st, _ := write(p, tokB, "b"); st != 200 || tokB <= tokA {
				t.Fatalf("B's write with token %d (A had %d): %d", tokB, tokA, st)
			}
			if err := p.stop(); err != nil {
				t.Fatal(err)
			}

			tc.lose(t, db, backup)
			p = start(t, dir, env, "api", "gate")
			if !strings.Contains(p.logs.String(), "lost data") {
				t.Errorf("no loss logged:\n%s", p.logs)
			}
			for _, tok := range []int64{tokA, tokB} {
				if st, body := write(p, tok, "pre-loss"); st != http.StatusConflict {
					t.Fatalf("pre-loss token %d before any post-loss write: %d %v", tok, st, body)
				}
			}
			st, c, _ := call(t, "POST", p.url("api", "/v1/leases/job:1/acquire"), nil, `{"owner":"c"}`)
			if st != 200 || token(t, c) <= tokB {
				t.Fatalf("acquire after the loss: %d %v; want a token above %d", st, c, tokB)
			}
			if st, _ := write(p, token(t, c), "c"); st != 200 {
				t.Fatalf("C's write: %d", st)
			}
			for _, tok := range []int64{tokA, tokB} {
				if st, body := write(p, tok, "pre-loss"); st != http.StatusConflict || body["code"] != "stale-token" {
					t.Fatalf("pre-loss token %d after a post-loss write: %d %v", tok, st, body)
				}
			}
			got := rec.list()
			if len(got) != 3 || strings.Contains(strings.Join(got, "\n"), "pre-loss") {
				t.Fatalf("upstream saw %q, want A's, B's and C's writes only", got)
			}
			if err := p.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func copyE2E(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
