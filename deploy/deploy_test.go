package deploy

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/tiedproc"
)

// binary is fencegate built by the Dockerfile's own go build line.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fencegate-deploy")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "fencegate")
	if err := buildLikeDockerfile(binary); err != nil {
		fmt.Fprintln(os.Stderr, "building fencegate with the Dockerfile's command:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Build arguments the test gives the Dockerfile's build line.
const (
	buildVersion = "v0.0.0-deploytest"
	buildCommit  = "0123456789abcdef0123456789abcdef01234567"
	buildDate    = "2026-01-02T03:04:05Z"
)

// dockerBuildLine is the Dockerfile's RUN line with go build.
func dockerBuildLine() (string, error) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			return strings.TrimPrefix(line, "RUN "), nil
		}
	}
	return "", fmt.Errorf("no RUN ... go build line in the Dockerfile")
}

// buildLikeDockerfile runs the Dockerfile's go build line in the repository
// root with the build arguments set, writing the binary to out instead of
// /out/fencegate.
func buildLikeDockerfile(out string) error {
	line, err := dockerBuildLine()
	if err != nil {
		return err
	}
	if !strings.Contains(line, "-o /out/fencegate") {
		return fmt.Errorf("build line %q does not write /out/fencegate", line)
	}
	line = strings.Replace(line, "-o /out/fencegate", "-o "+out, 1)
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "VERSION="+buildVersion, "COMMIT="+buildCommit, "DATE="+buildDate)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

func TestDockerImageBuild(t *testing.T) {
	line, err := dockerBuildLine()
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X main.version=", "-X main.commit=", "-X main.date="} {
		if !strings.Contains(line, flag) {
			t.Errorf("the Dockerfile's build line lacks %q: %s", flag, line)
		}
	}
	// Stripped: no symbol table, no DWARF.
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, s := range []string{".symtab", ".debug_info"} {
		if f.Section(s) != nil {
			t.Errorf("the image's binary has a %s section: not stripped", s)
		}
	}
	out, err := exec.Command(binary, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{buildVersion, "commit " + buildCommit, "built " + buildDate} {
		if !strings.Contains(string(out), w) {
			t.Errorf("fencegate version = %q, lacks %q", out, w)
		}
	}
}

func TestDockerfileRuntime(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// The final stage: everything after the last FROM.
	df := string(b)
	final := df[strings.LastIndex(df, "\nFROM "):]
	for _, re := range []string{
		`(?m)^FROM gcr\.io/distroless/static[^ ]*:nonroot$`,
		`(?m)^USER 65532(:65532)?$`,
		`(?m)^WORKDIR /data$`,
		`(?m)^VOLUME /data$`,
		`(?m)^COPY --from=build --chown=65532:65532 \S+ /data$`,
		`(?m)^HEALTHCHECK .*CMD \["/usr/local/bin/fencegate", "health"\]$`,
		`(?m)^ENTRYPOINT \["/usr/local/bin/fencegate"\]$`,
	} {
		if !regexp.MustCompile(re).MatchString(final) {
			t.Errorf("the Dockerfile's final stage does not match %s", re)
		}
	}
	// The default store is relative to the working directory, the volume.
	if !strings.Contains(defaultOf(t, "FENCEGATE_STORE"), "file:fencegate.db") {
		t.Errorf("the default store is no longer file:fencegate.db; check the Dockerfile's VOLUME")
	}
	ignore, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(ignore))
	for _, w := range []string{".git", "*.db", "/fencegate", "*.test"} {
		if !slices.Contains(lines, w) {
			t.Errorf(".dockerignore does not exclude %s", w)
		}
	}
}

// scraped is a real /metrics scrape of fencegate after a lease, an
// admitted write, refused writes and readiness probes: its metric names,
// and its series lines (name{labels} value).
type scraped struct {
	names  map[string]bool
	series []string
}

var scrape = sync.OnceValues(scrapeMetrics)

func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	s, err := scrape()
	if err != nil {
		t.Fatal(err)
	}
	return s.names
}

// scrapedSeries is the series lines of the scrape.
func scrapedSeries(t *testing.T) []string {
	t.Helper()
	s, err := scrape()
	if err != nil {
		t.Fatal(err)
	}
	return s.series
}

func scrapeMetrics() (*scraped, error) {
	dir, err := os.MkdirTemp("", "fencegate-scrape")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	up, upAddr, err := startBinary(dir, nil, "demo upstream listening", "demo-upstream", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer up.stop()
	// A service name of the user's own, as OTEL_SERVICE_NAME allows: the
	// alerts and the dashboard must find fencegate without the default.
	fg, apiAddr, err := startBinary(dir, []string{"FENCEGATE_STORE=memory:", "FENCEGATE_API_ADDR=127.0.0.1:0",
		"FENCEGATE_PROXY_ADDR=127.0.0.1:0", "FENCEGATE_UPSTREAM=http://" + upAddr, "OTEL_SERVICE_NAME=jobs-sidecar"}, `"listener":"api"`, "serve")
	if err != nil {
		return nil, err
	}
	defer fg.stop()
	gateAddr, err := fg.waitAddr(`"listener":"gate"`)
	if err != nil {
		return nil, err
	}
	do := func(method, url, body string, h map[string]string) error {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	api, gate := "http://"+apiAddr, "http://"+gateAddr
	steps := []error{
		do("POST", api+"/v1/leases/job:1/acquire", `{"owner":"a","ttl_seconds":1}`, map[string]string{"Content-Type": "application/json"}),
		do("POST", api+"/v1/leases/job:1/release", `{"owner":"a","token":1}`, map[string]string{"Content-Type": "application/json"}),
		do("POST", api+"/v1/leases/job:1/acquire", `{"owner":"b"}`, map[string]string{"Content-Type": "application/json"}),
		do("PUT", gate+"/jobs/1", "x", map[string]string{"Fencing-Token": "2", "Fencing-Resource": "job:1"}),
		do("PUT", gate+"/jobs/1", "x", map[string]string{"Fencing-Token": "1", "Fencing-Resource": "job:1"}),
		do("GET", api+"/readyz", "", nil),
	}
	for _, err := range steps {
		if err != nil {
			return nil, err
		}
	}
	resp, err := http.Get(api + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	s := &scraped{names: map[string]bool{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s.names[regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`).FindString(line)] = true
		s.series = append(s.series, line)
	}
	for _, want := range []string{"fencegate_gate_writes_total", "fencegate_store_duration_seconds_bucket"} {
		if !s.names[want] {
			return nil, fmt.Errorf("the scrape has no %s; got %v", want, s.names)
		}
	}
	return s, sc.Err()
}

// seriesMatch reports whether series (a scrape line) is selected by sel,
// a metric name with equality matchers (name{a="x",b="y"}). Target labels
// Prometheus adds at scrape time (instance, job) are not in a scrape and
// must not be matched on.
func seriesMatch(sel, series string) (bool, error) {
	name, matchers, _ := strings.Cut(sel, "{")
	name = strings.TrimSpace(name)
	sName, sLabels, _ := strings.Cut(series, "{")
	if i := strings.IndexByte(sName, ' '); i >= 0 {
		sName = sName[:i]
	}
	if name != sName {
		return false, nil
	}
	matchers = strings.TrimSuffix(strings.TrimSpace(matchers), "}")
	for _, m := range regexp.MustCompile(`\s*,\s*`).Split(matchers, -1) {
		if m == "" {
			continue
		}
		k, v, ok := strings.Cut(m, "=")
		if !ok || strings.ContainsAny(k, "!~") || strings.HasPrefix(v, "~") {
			return false, fmt.Errorf("matcher %q: only label=\"value\" is understood", m)
		}
		if k == "instance" || k == "job" {
			return false, fmt.Errorf("matcher %q: a target label, not in a scrape", m)
		}
		if !strings.Contains(sLabels, k+"="+v) {
			return false, nil
		}
	}
	return true, nil
}

// running is a fencegate process started by startBinary.
type running struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	more  chan struct{} // receives after each new line
	done  chan struct{}
}

// startBinary runs the binary and waits for a JSON log line containing
// marker, returning the line's "addr".
func startBinary(dir string, env []string, marker string, args ...string) (*running, string, error) {
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...) // never the test's own environment
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, "", err
	}
	if err := tiedproc.Start(cmd, syscall.SIGTERM); err != nil {
		return nil, "", err
	}
	r := &running{cmd: cmd, more: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			r.mu.Lock()
			r.lines = append(r.lines, sc.Text())
			r.mu.Unlock()
			select {
			case r.more <- struct{}{}:
			default:
			}
		}
		cmd.Wait()
		close(r.done)
	}()
	addr, err := r.waitAddr(marker)
	if err != nil {
		r.stop()
		return nil, "", err
	}
	return r, addr, nil
}

func (r *running) waitAddr(marker string) (string, error) {
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		for _, l := range r.lines {
			if strings.Contains(l, marker) {
				r.mu.Unlock()
				var rec struct{ Addr string }
				if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Addr == "" {
					return "", fmt.Errorf("no addr in %q", l)
				}
				return rec.Addr, nil
			}
		}
		logs := strings.Join(r.lines, "\n")
		r.mu.Unlock()
		select {
		case <-r.more:
		case <-r.done:
			return "", fmt.Errorf("%v exited before logging %q:\n%s", r.cmd.Args, marker, logs)
		case <-deadline:
			return "", fmt.Errorf("%v did not log %q:\n%s", r.cmd.Args, marker, logs)
		}
	}
}

func (r *running) stop() {
	r.cmd.Process.Kill()
	<-r.done
}

// promqlMetrics returns the metric names a PromQL expression selects. It
// knows the expression shapes the rules and dashboard use: selectors,
// functions, aggregations with by/without, binary operators and
// comparisons, Grafana variables.
func promqlMetrics(expr string) []string {
	s := regexp.MustCompile(`"(?:[^"\\]|\\.)*"`).ReplaceAllString(expr, `""`) // string literals
	s = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(s, " ")              // label matchers
	s = regexp.MustCompile(`\[[^\]]*\]`).ReplaceAllString(s, " ")             // ranges
	s = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`).ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\$\{?\w+\}?`).ReplaceAllString(s, " ") // Grafana variables
	var names []string
	for _, m := range regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`).FindAllString(s, -1) {
		if strings.HasSuffix(m, "(") { // a function or aggregation
			continue
		}
		switch m {
		case "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan":
			continue
		}
		names = append(names, m)
	}
	return names
}

// synthetic are series Prometheus makes itself, not found in a scrape.
var synthetic = map[string]bool{"up": true}

func checkExpr(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	used := promqlMetrics(expr)
	if len(used) == 0 {
		t.Errorf("%s: no metric found in %q", where, expr)
	}
	for _, n := range used {
		if !names[n] && !synthetic[n] {
			t.Errorf("%s: %q queries %s, which fencegate does not export", where, expr, n)
		}
	}
}

func TestPromQLMetricsExtraction(t *testing.T) {
	got := promqlMetrics(`sum by (code) (rate(a_total{code=~"x|y"}[5m])) / on(instance) group_left() b > bool 0 or histogram_quantile(0.9, rate(c_bucket{i=~"$instance"}[$__rate_interval]))`)
	if !slices.Equal(got, []string{"a_total", "b", "c_bucket"}) {
		t.Fatalf("promqlMetrics = %v", got)
	}
}

// promtool is the path of promtool, or "" with the test skipped; with
// FENCEGATE_REQUIRE_PROMTOOL=1 (scripts/test.sh) a missing one fails.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("FENCEGATE_REQUIRE_PROMTOOL") == "1" {
			t.Fatal("promtool not found (Debian package prometheus); FENCEGATE_REQUIRE_PROMTOOL=1")
		}
		t.Skip("promtool not found (install Debian's prometheus package); skipping promtool check rules")
	}
	return p
}

func TestAlertRules(t *testing.T) {
	const file = "prometheus/fencegate-alerts.yml"
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr string
			}
		}
	}
	if err := decodeYAMLStrictless(file, &rules); err != nil {
		t.Fatal(err)
	}
	names := metricNames(t)
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkExpr(t, file+" "+r.Alert, r.Expr, names)
		}
	}
	for _, want := range []string{"FencegateStaleWrites", "FencegateStoreUnavailable", "FencegateBarrierTimeouts", "FencegateUpstreamErrors", "FencegateNotReady"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no %s alert", want)
		}
	}
	out, err := exec.Command(promtool(t), "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

func TestGrafanaDashboard(t *testing.T) {
	const file = "grafana/fencegate-dashboard.json"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		UID    string
		Panels []struct {
			ID      int
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name, Type string
				Query      json.RawMessage // a query variable's {"query": ...}, a data source's type
			}
		}
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&dash); err != nil {
		t.Fatal(err)
	}
	if dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard without uid or panels: %+v", dash)
	}
	names := metricNames(t)
	var exprs []string
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkExpr(t, fmt.Sprintf("panel %q", p.Title), tg.Expr, names)
			exprs = append(exprs, tg.Expr)
		}
	}
	// Each query variable (the instance picker) lists the values of a
	// label on series fencegate exports, with the configuration a user may
	// choose (a service name of their own) as well as the default.
	series := scrapedSeries(t)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %q: %v", v.Name, err)
		}
		m := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`).FindStringSubmatch(strings.TrimSpace(q.Query))
		if m == nil {
			t.Errorf("variable %q: query %q is not label_values(selector, label)", v.Name, q.Query)
			continue
		}
		checkExpr(t, fmt.Sprintf("variable %q", v.Name), m[1], names)
		found := false
		for _, line := range series {
			ok, err := seriesMatch(m[1], line)
			if err != nil {
				t.Fatalf("variable %q: %v", v.Name, err)
			}
			found = found || ok
		}
		if !found {
			t.Errorf("variable %q: %s selects no series of fencegate's scrape (with OTEL_SERVICE_NAME set): its picker would be empty", v.Name, m[1])
		}
	}
	// PromQL syntax, by promtool: each query as a recording rule, with
	// the Grafana variables given values.
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		e = strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*").Replace(e)
		q, _ := json.Marshal(e)
		fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool(t), "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s\n%s", err, out, rules.String())
	}
}

// TestMetricsDocumented: every fencegate_* metric of the binary's scrape is
// named in the docs by the name Prometheus shows, so a dashboard or alert
// written from the docs queries a metric that exists.
func TestMetricsDocumented(t *testing.T) {
	var docs strings.Builder
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, "../README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs.Write(b)
	}
	names := metricNames(t)
	for name := range names {
		if !strings.HasPrefix(name, "fencegate_") {
			continue
		}
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && names[base+"_bucket"] {
				family = base
			}
		}
		if !strings.Contains(docs.String(), "`"+family+"`") && !strings.Contains(docs.String(), "`"+family+"{") {
			t.Errorf("the binary exports %s, which no page of docs/ names", family)
		}
	}
}
