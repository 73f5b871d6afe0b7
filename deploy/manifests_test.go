package deploy

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/fencegate/fencegate/config"
	"github.com/fencegate/fencegate/proxy"
)

// decodeYAMLStrictless decodes a YAML file into v, ignoring fields v does
// not have (for files whose full schema is not ours: compose, rules).
func decodeYAMLStrictless(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// defaultOf is a variable's default from the config package.
func defaultOf(t *testing.T, name string) string {
	t.Helper()
	for _, v := range config.Help() {
		if v.Name == name {
			return v.Default
		}
	}
	t.Fatalf("no variable %s", name)
	return ""
}

// drainBudget is how long fencegate may take to stop with env: the drain
// delay plus the shutdown grace.
func drainBudget(t *testing.T, env map[string]string) time.Duration {
	t.Helper()
	var total time.Duration
	for _, name := range []string{"FENCEGATE_DRAIN_DELAY", "FENCEGATE_SHUTDOWN_GRACE"} {
		v, ok := env[name]
		if !ok {
			v = defaultOf(t, name)
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, v, err)
		}
		total += d
	}
	return total
}

// loadConfig loads env with fencegate's own config package, and its rules
// (FENCEGATE_RULES, or the text given for FENCEGATE_RULES_FILE).
func loadConfig(t *testing.T, where string, env map[string]string, rulesFile string) config.Config {
	t.Helper()
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	cfg, err := config.Load(environ)
	if err != nil {
		t.Fatalf("%s: fencegate would not start: %v", where, err)
	}
	rules := cfg.Rules
	if cfg.RulesFile != "" {
		rules = rulesFile
	}
	if cfg.Upstream != "" {
		if r, err := proxy.ParseRules(rules); err != nil || len(r) == 0 {
			t.Fatalf("%s: rules %q: %d rules, %v", where, rules, len(r), err)
		}
	}
	return cfg
}

func TestDockerCompose(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Build           string
			Command         []string
			Environment     map[string]string
			StopGracePeriod string `json:"stop_grace_period"`
			Healthcheck     struct{ Test []string }
			DependsOn       map[string]struct{ Condition string } `json:"depends_on"`
		}
	}
	if err := decodeYAMLStrictless("../docker-compose.yml", &compose); err != nil {
		t.Fatal(err)
	}
	fg, ok := compose.Services["fencegate"]
	if !ok {
		t.Fatal("no fencegate service")
	}
	cfg := loadConfig(t, "docker-compose fencegate", fg.Environment, "")
	if _, port, _ := strings.Cut(cfg.APIAddr, ":"); port == "" {
		t.Fatalf("API address %q", cfg.APIAddr)
	}
	grace, err := time.ParseDuration(fg.StopGracePeriod)
	if err != nil {
		t.Fatalf("stop_grace_period %q: %v", fg.StopGracePeriod, err)
	}
	if budget := drainBudget(t, fg.Environment); grace <= budget {
		t.Errorf("stop_grace_period %v is not above the drain (%v): Docker would kill fencegate mid-drain", grace, budget)
	}
	if !slices.Contains(fg.Healthcheck.Test, "health") {
		t.Errorf("fencegate healthcheck %v does not run fencegate health", fg.Healthcheck.Test)
	}
	up := compose.Services["upstream"]
	if !slices.Contains(up.Healthcheck.Test, "--url") {
		t.Errorf("the upstream inherits the image's /readyz healthcheck: %v", up.Healthcheck.Test)
	}
	if fg.DependsOn["upstream"].Condition != "service_healthy" {
		t.Errorf("fencegate does not wait for a healthy upstream: %+v", fg.DependsOn)
	}
}

// k8sObjects decodes a multi-document manifest strictly: every document's
// kind must be one of the typed objects below, and an unknown or
// misspelt field anywhere is an error, as kubectl's strict validation
// would report.
func k8sObjects(t *testing.T, file string, b []byte) (deps []appsv1.Deployment, secrets []corev1.Secret, cms []corev1.ConfigMap, svcs []corev1.Service, pols []networkingv1.NetworkPolicy, pdbs []policyv1.PodDisruptionBudget) {
	t.Helper()
	for i, doc := range bytes.Split(b, []byte("\n---\n")) {
		var meta struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s document %d: %v", file, i, err)
		}
		var target any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			deps = append(deps, appsv1.Deployment{})
			target = &deps[len(deps)-1]
		case "v1 Secret":
			secrets = append(secrets, corev1.Secret{})
			target = &secrets[len(secrets)-1]
		case "v1 ConfigMap":
			cms = append(cms, corev1.ConfigMap{})
			target = &cms[len(cms)-1]
		case "v1 Service":
			svcs = append(svcs, corev1.Service{})
			target = &svcs[len(svcs)-1]
		case "networking.k8s.io/v1 NetworkPolicy":
			pols = append(pols, networkingv1.NetworkPolicy{})
			target = &pols[len(pols)-1]
		case "policy/v1 PodDisruptionBudget":
			pdbs = append(pdbs, policyv1.PodDisruptionBudget{})
			target = &pdbs[len(pdbs)-1]
		default:
			t.Fatalf("%s document %d: unexpected %s %s", file, i, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, target); err != nil {
			t.Fatalf("%s document %d (%s): %v", file, i, meta.Kind, err)
		}
	}
	return deps, secrets, cms, svcs, pols, pdbs
}

func envFrom(c *corev1.Container, name string) *corev1.EnvVarSource {
	for _, e := range c.Env {
		if e.Name == name {
			return e.ValueFrom
		}
	}
	return nil
}

// resolvePort turns a named container port into its number.
func resolvePort(c *corev1.Container, port string) string {
	for _, p := range c.Ports {
		if p.Name == port {
			return fmt.Sprint(p.ContainerPort)
		}
	}
	return port
}

// mountedConfigMapFile is the text of the ConfigMap key mounted at path in
// container c of pod.
func mountedConfigMapFile(t *testing.T, pod corev1.PodSpec, c *corev1.Container, cms []corev1.ConfigMap, path string) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		key, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			for _, cm := range cms {
				if cm.Name == v.ConfigMap.Name {
					if text, ok := cm.Data[key]; ok {
						return text
					}
				}
			}
		}
	}
	t.Fatalf("%s is not a file of a ConfigMap mounted in %s", path, c.Name)
	return ""
}
