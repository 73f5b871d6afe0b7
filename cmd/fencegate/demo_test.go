package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestDemoUpstream checks what the README's walkthrough and docker-compose
// rely on: a write is stored with the Fencing-Token it carried, GET reads it
// back, GET / lists everything, DELETE removes it.
func TestDemoUpstream(t *testing.T) {
	srv := httptest.NewServer(&demoUpstream{items: map[string]demoItem{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer srv.Close()
	do := func(method, path, token, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Fencing-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		raw, _ := io.ReadAll(resp.Body)
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatalf("%s %s: not JSON: %q", method, path, raw)
			}
		}
		return resp.StatusCode, m
	}

	if st, m := do("PUT", "/jobs/7", "2", `{"step":1,"by":"b"}`); st != 200 || m["fencing_token"] != "2" {
		t.Fatalf("PUT: %d %v", st, m)
	}
	if st, _ := do("POST", "/notes/1", "3", "plain text"); st != 200 {
		t.Fatalf("POST: %d", st)
	}
	st, m := do("GET", "/jobs/7", "", "")
	if body, _ := m["body"].(map[string]any); st != 200 || m["path"] != "/jobs/7" || m["fencing_token"] != "2" || m["method"] != "PUT" || body["by"] != "b" {
		t.Fatalf("GET /jobs/7: %d %v", st, m)
	}
	if _, m := do("GET", "/notes/1", "", ""); m["text"] != "plain text" {
		t.Fatalf("a non-JSON body is not kept as text: %v", m)
	}
	if st, _ := do("DELETE", "/notes/1", "4", ""); st != http.StatusNoContent {
		t.Fatalf("DELETE: %d", st)
	}
	if st, _ := do("GET", "/notes/1", "", ""); st != http.StatusNotFound {
		t.Fatalf("GET after DELETE: %d", st)
	}
	_, m = do("GET", "/", "", "")
	if items, _ := m["items"].([]any); len(items) != 1 || items[0].(map[string]any)["path"] != "/jobs/7" {
		t.Fatalf("GET /: %v", m)
	}
}
