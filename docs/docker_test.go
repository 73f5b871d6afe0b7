package docs

// The container commands the docs give must not publish an
// unauthenticated lease API beyond the host.

import (
	"regexp"
	"strings"
	"testing"
)

// dockerRun finds the docker run command lines in a page's shell blocks
// (continuation lines joined).
func dockerRunLines(text string) []string {
	var out []string
	fenced := false
	var cur strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			continue
		}
		cur.WriteString(strings.TrimSuffix(line, "\\"))
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(" ")
			continue
		}
		l := cur.String()
		cur.Reset()
		if strings.Contains(l, "docker run") {
			out = append(out, l)
		}
	}
	return out
}

var publish = regexp.MustCompile(`(?:^|\s)(?:-p|--publish)[ =](\S+)`)

// TestDockerRunKeepsTheLeaseAPIOnLoopback: a docker run in the docs that
// makes the lease API listen beyond the container's loopback without a
// credential publishes it on the host's loopback only: `-p 7070:7070`
// publishes on every interface of the host (and Docker's rules pass by
// host firewalls such as ufw), so anyone on the network could take and
// release every lease. docker-compose.yml publishes on 127.0.0.1 too.
func TestDockerRunKeepsTheLeaseAPIOnLoopback(t *testing.T) {
	checked := 0
	for _, page := range pages(t) {
		for _, line := range dockerRunLines(read(t, page)) {
			if !strings.Contains(line, "FENCEGATE_API_ADDR=0.0.0.0") && !strings.Contains(line, "FENCEGATE_API_ADDR=[::]") {
				continue
			}
			checked++
			if strings.Contains(line, "FENCEGATE_API_TOKEN") || strings.Contains(line, "FENCEGATE_ACCESS_FILE") || strings.Contains(line, "FENCEGATE_API_TLS_CLIENT_CA") {
				continue
			}
			for _, m := range publish.FindAllStringSubmatch(line, -1) {
				spec := m[1]
				if strings.Count(spec, ":") >= 2 && (strings.HasPrefix(spec, "127.") || strings.HasPrefix(spec, "[::1]")) {
					continue // host side bound to loopback
				}
				t.Errorf("%s: %q publishes the unauthenticated lease API on every host interface (-p %s); use -p 127.0.0.1:7070:7070 as docker-compose.yml does, or set FENCEGATE_API_TOKEN", page, strings.TrimSpace(line), spec)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no docker run in the docs makes the lease API listen beyond loopback: nothing checked (is the check still finding the commands?)")
	}
}
