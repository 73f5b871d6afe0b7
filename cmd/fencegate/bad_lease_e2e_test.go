package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAcquisitionAnsweredWithoutAValidTokenExits4: an API that answers an
// acquisition 200 with JSON that is not a lease holding a valid fencing
// token (a positive integer of at most 20 digits), or a lease of another
// resource, is not the lease API: lease acquire (either output) and run
// exit 4 and print no token, and run does not start CMD. They used to exit
// 0, printing {} or 0 or -1 as the lease, and run started CMD with
// FENCING_TOKEN=0.
func TestAcquisitionAnsweredWithoutAValidTokenExits4(t *testing.T) {
	times := func() string {
		now := time.Now().UTC()
		return `"ttl_seconds":30,"acquired_at":"` + now.Format(time.RFC3339Nano) + `","expires_at":"` + now.Add(30*time.Second).Format(time.RFC3339Nano) + `"`
	}
	bodies := map[string]func() string{
		"empty object": func() string { return `{}` },
		"null":         func() string { return `null` },
		"array":        func() string { return `[]` },
		"token 0":      func() string { return `{"resource":"job:1","owner":"me","token":0,` + times() + `}` },
		"token -1":     func() string { return `{"resource":"job:1","owner":"me","token":-1,` + times() + `}` },
		"token 1.5":    func() string { return `{"resource":"job:1","owner":"me","token":1.5,` + times() + `}` },
		"token 1e3":    func() string { return `{"resource":"job:1","owner":"me","token":1e3,` + times() + `}` },
		"token too big": func() string {
			return `{"resource":"job:1","owner":"me","token":99999999999999999999999,` + times() + `}`
		},
		"another resource": func() string { return `{"resource":"job:2","owner":"me","token":7,` + times() + `}` },
	}
	for name, body := range bodies {
		env := notTheAPI(t, func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasSuffix(r.URL.Path, "/acquire") {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body())
		})
		for _, args := range [][]string{
			{"lease", "acquire", "job:1", "--owner", "me"},
			{"lease", "acquire", "job:1", "--owner", "me", "--output", "token"},
			{"run", "--resource", "job:1", "--owner", "me", "--wait", "0s", "--", "sh", "-c", "echo ran $FENCING_TOKEN"},
		} {
			r := fg(t, env, "", args...)
			if r.code != exitUnavailable || r.stdout != "" || !strings.Contains(r.stderr, "lease API") {
				t.Errorf("%s: %v: exit %d, stdout %q, stderr %q; want 4, nothing on stdout, naming the lease API", name, args, r.code, r.stdout, r.stderr)
			}
		}
	}
}
