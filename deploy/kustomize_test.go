package deploy

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/fencegate/fencegate/config"
)

// measuredRSS is the gate's highest measured RSS (1,000 client connections,
// docs/performance.md): the sidecar's memory request must cover it.
var measuredRSS = resource.MustParse("53Mi")

// testToken is the lease API token render gives the overlays, as the
// file each reads it from (which no checkout has: the user makes it).
const testToken = "0123456789abcdef0123456789abcdef"

// render builds a kustomization as kubectl apply -k would, on a copy of
// the kubernetes tree in memory, with each overlay's api-token file made.
func render(t *testing.T, dir string) []byte {
	t.Helper()
	m, err := build(t, dir, true)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// build runs kustomize on dir in an in-memory copy of the kubernetes
// tree, with each overlay's api-token file when withToken is set.
func build(t *testing.T, dir string, withToken bool) (resmap.ResMap, error) {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	err := filepath.WalkDir("kubernetes", func(path string, d iofs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return fs.WriteFile(path, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if withToken {
		overlays, err := os.ReadDir("kubernetes/overlays")
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range overlays {
			if err := fs.WriteFile(filepath.Join("kubernetes/overlays", o.Name(), "api-token"), []byte(testToken)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, dir)
}

// TestOverlaysShipNoToken: an overlay does not build without the API token
// file its user makes: no token in the repository can be deployed.
func TestOverlaysShipNoToken(t *testing.T) {
	for _, overlay := range []string{"single", "replicated"} {
		if _, err := build(t, "kubernetes/overlays/"+overlay, false); err == nil || !strings.Contains(err.Error(), "api-token") {
			t.Errorf("overlay %s builds without its api-token file (err %v): it ships a token", overlay, err)
		}
	}
}

// TestKubernetesOverlays renders every overlay and checks what a user
// deploys: strictly valid objects, a fencegate sidecar fencegate accepts
// the configuration of, probes, drain, lock-down, the API token and store
// from Secrets, a real image tag, resources above the measured RSS, and
// more than one replica only with the shared barrier on a shared store.
func TestKubernetesOverlays(t *testing.T) {
	for _, overlay := range []string{"single", "replicated"} {
		t.Run(overlay, func(t *testing.T) {
			dir := "kubernetes/overlays/" + overlay
			deps, secrets, cms, svcs, pols, pdbs := k8sObjects(t, dir, render(t, dir))
			checkSidecarDeployment(t, dir, deps, secrets, cms, svcs)
			checkDisruptionBudgets(t, dir, deps, pdbs)
			var jobsPodLabels map[string]string
			for _, d := range deps {
				if d.Name == "jobs" {
					jobsPodLabels = d.Spec.Template.Labels
				}
			}
			for _, d := range deps {
				// A store of one instance (the example's Valkey, the
				// single overlay's file store) must never run twice at once.
				if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType && (d.Name != "jobs" || overlay == "single") {
					t.Errorf("%s: Deployment %s updates by %q: an old and a new instance of its store would run at once; want Recreate", dir, d.Name, d.Spec.Strategy.Type)
				}
				if d.Name != "jobs" {
					checkStoreLockedDown(t, dir, d, jobsPodLabels, pols)
				}
			}
		})
	}
	// The base alone is one replica, whatever the overlays do.
	deps, _, _, _, _, pdbs := k8sObjects(t, "kubernetes/base", render(t, "kubernetes/base"))
	if len(deps) != 1 || deps[0].Spec.Replicas == nil || *deps[0].Spec.Replicas != 1 {
		t.Errorf("the base must run one replica (the local barrier orders one gate's writes only)")
	}
	checkDisruptionBudgets(t, "kubernetes/base", deps, pdbs)
}

// checkDisruptionBudgets: a Deployment of several replicas has a
// PodDisruptionBudget that selects its pods and lets voluntary disruptions
// (a node drain, a cluster upgrade) take at least one of them but never all
// at once, so the Service keeps a gate that admits writes; one of a single
// replica has none that forbids every eviction, which would block node
// drains for good.
func checkDisruptionBudgets(t *testing.T, where string, deps []appsv1.Deployment, pdbs []policyv1.PodDisruptionBudget) {
	t.Helper()
	for _, d := range deps {
		replicas := 1
		if d.Spec.Replicas != nil {
			replicas = int(*d.Spec.Replicas)
		}
		var budgets []policyv1.PodDisruptionBudget
		for _, p := range pdbs {
			sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if err != nil {
				t.Fatalf("%s: PodDisruptionBudget %s: %v", where, p.Name, err)
			}
			if p.Namespace == d.Namespace && !sel.Empty() && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				budgets = append(budgets, p)
			}
		}
		if replicas > 1 && len(budgets) == 0 {
			t.Errorf("%s: Deployment %s runs %d replicas without a PodDisruptionBudget: a node drain may evict them all at once", where, d.Name, replicas)
		}
		for _, p := range budgets {
			// How many pods evictions may take at once under p.
			var disruptable int
			switch {
			case p.Spec.MaxUnavailable != nil && p.Spec.MinAvailable == nil:
				n, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MaxUnavailable, replicas, true)
				if err != nil {
					t.Fatalf("%s: PodDisruptionBudget %s: %v", where, p.Name, err)
				}
				disruptable = n
			case p.Spec.MinAvailable != nil && p.Spec.MaxUnavailable == nil:
				n, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MinAvailable, replicas, true)
				if err != nil {
					t.Fatalf("%s: PodDisruptionBudget %s: %v", where, p.Name, err)
				}
				disruptable = replicas - n
			default:
				t.Errorf("%s: PodDisruptionBudget %s sets neither or both of minAvailable and maxUnavailable", where, p.Name)
				continue
			}
			if disruptable < 1 {
				t.Errorf("%s: PodDisruptionBudget %s lets no pod of Deployment %s (%d replicas) be evicted: node drains would block", where, p.Name, d.Name, replicas)
			}
			if disruptable > replicas-1 && replicas > 1 {
				t.Errorf("%s: PodDisruptionBudget %s lets all %d pods of Deployment %s be evicted at once", where, p.Name, replicas, d.Name)
			}
		}
	}
}

// checkStoreLockedDown: a store shipped with an overlay (its example
// Valkey) runs on a read-only root file system, and a NetworkPolicy lets
// only the fencegate sidecars reach its pods (whose labels, jobsPodLabels,
// must carry the one it admits): anything else that reached it could
// rewrite the marks fencing relies on.
func checkStoreLockedDown(t *testing.T, where string, d appsv1.Deployment, jobsPodLabels map[string]string, pols []networkingv1.NetworkPolicy) {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
			t.Errorf("%s: store %s container %s has a writable root file system", where, d.Name, c.Name)
		}
	}
	sidecar := map[string]string{"app.kubernetes.io/component": "fencegate-sidecar"}
	if !matches(sidecar, jobsPodLabels) {
		t.Errorf("%s: the fencegate pods' labels %v lack %v, which the store's NetworkPolicy admits", where, jobsPodLabels, sidecar)
	}
	for _, p := range pols {
		if !matches(p.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) || !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		only := len(p.Spec.Ingress) > 0
		for _, rule := range p.Spec.Ingress {
			if len(rule.From) == 0 {
				only = false // from anywhere
			}
			for _, peer := range rule.From {
				if peer.IPBlock != nil || peer.NamespaceSelector != nil || peer.PodSelector == nil || !matches(peer.PodSelector.MatchLabels, sidecar) || len(peer.PodSelector.MatchLabels) == 0 {
					only = false
				}
			}
		}
		if only {
			return
		}
	}
	t.Errorf("%s: no NetworkPolicy lets only the fencegate sidecars reach store %s", where, d.Name)
}

func checkSidecarDeployment(t *testing.T, where string, deps []appsv1.Deployment, secrets []corev1.Secret, cms []corev1.ConfigMap, svcs []corev1.Service) {
	t.Helper()
	var dep *appsv1.Deployment
	var fg *corev1.Container
	for i := range deps {
		for j := range deps[i].Spec.Template.Spec.InitContainers {
			if deps[i].Spec.Template.Spec.InitContainers[j].Name == "fencegate" {
				dep, fg = &deps[i], &deps[i].Spec.Template.Spec.InitContainers[j]
			}
		}
	}
	if fg == nil {
		t.Fatal("no Deployment with a fencegate init container: a native sidecar is an init container")
	}
	if fg.RestartPolicy == nil || *fg.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatal("the fencegate init container lacks restartPolicy: Always, so it is not a sidecar")
	}
	pod := dep.Spec.Template.Spec
	sel := dep.Spec.Selector.MatchLabels
	var svc *corev1.Service
	for i := range svcs {
		if len(svcs[i].Spec.Selector) > 0 && matches(svcs[i].Spec.Selector, dep.Spec.Template.Labels) {
			svc = &svcs[i]
		}
	}
	if len(sel) == 0 || !matches(sel, dep.Spec.Template.Labels) || svc == nil {
		t.Errorf("selector %v does not match the pod labels %v, or no Service selects them", sel, dep.Spec.Template.Labels)
	}

	// The environment, with Secret references resolved, is one fencegate
	// accepts.
	env := map[string]string{}
	for _, e := range fg.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := "", false
			for _, s := range secrets {
				if s.Name == ref.Name {
					if b, found := s.Data[ref.Key]; found {
						v, ok = string(b), true
					} else {
						v, ok = s.StringData[ref.Key]
					}
				}
			}
			if !ok {
				t.Fatalf("%s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = v
		default:
			t.Fatalf("%s: unsupported valueFrom", e.Name)
		}
	}
	for _, name := range []string{"FENCEGATE_STORE", "FENCEGATE_API_TOKEN"} {
		if ref := envFrom(fg, name); ref == nil || ref.SecretKeyRef == nil {
			t.Errorf("%s does not come from a Secret", name)
		}
	}
	var rulesText string
	if path := env["FENCEGATE_RULES_FILE"]; path != "" {
		rulesText = mountedConfigMapFile(t, pod, fg, cms, path)
	}
	cfg := loadConfig(t, where, env, rulesText)

	// More than one replica only with the shared barrier on a shared store.
	replicas := int32(1)
	if dep.Spec.Replicas != nil {
		replicas = *dep.Spec.Replicas
	}
	spec, err := config.ParseStore(cfg.Store)
	if err != nil {
		t.Fatal(err)
	}
	if replicas > 1 && (cfg.Barrier != config.BarrierShared || spec.Kind == config.StoreFile || spec.Kind == config.StoreMemory) {
		t.Errorf("%d replicas with FENCEGATE_BARRIER=%s on %s: writes through different gates could reach the service out of token order",
			replicas, cfg.Barrier, config.RedactURL(cfg.Store))
	}
	if spec.Kind == config.StoreFile {
		dir := cfg.Store[strings.Index(cfg.Store, ":")+1:]
		if i := strings.LastIndex(dir, "/"); i > 0 {
			dir = dir[:i]
		}
		if !slices.ContainsFunc(fg.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == dir && !m.ReadOnly }) {
			t.Errorf("the file store %s is not on a writable volume (the root file system is read-only)", cfg.Store)
		}
	}

	// A real image: not :latest, not a registry the project does not publish to.
	if strings.HasSuffix(fg.Image, ":latest") || !strings.Contains(fg.Image, ":") || strings.HasPrefix(fg.Image, "ghcr.io/fencegate/") {
		t.Errorf("image %q: want an image you build and tag (no :latest, no unpublished registry)", fg.Image)
	}
	// Memory from the measured RSS.
	req, lim := fg.Resources.Requests[corev1.ResourceMemory], fg.Resources.Limits[corev1.ResourceMemory]
	if req.Cmp(measuredRSS) < 0 || lim.Cmp(req) <= 0 {
		t.Errorf("memory request %s / limit %s: want a request of at least the measured %s and a limit above it", req.String(), lim.String(), measuredRSS.String())
	}
	// The connections the memory was measured at: the default cap (4,096
	// a listener) lets clients stalling small bodies take more than the
	// limit.
	if cfg.MaxConns > 1000 {
		t.Errorf("FENCEGATE_MAX_CONNS %d: want at most the 1,000 connections the memory limit was measured at", cfg.MaxConns)
	}
	// Go's soft memory limit below the container's, above what it uses.
	if soft, err := goMemLimit(env["GOMEMLIMIT"]); err != nil {
		t.Errorf("GOMEMLIMIT: %v", err)
	} else if soft <= measuredRSS.Value() || float64(soft) > 0.95*float64(lim.Value()) {
		t.Errorf("GOMEMLIMIT %s: want it above the measured %s and at most 95 %% of the memory limit %s, so the collector acts before the kernel does",
			env["GOMEMLIMIT"], measuredRSS.String(), lim.String())
	}

	// Probes ask the lease API's port: livez for liveness, readyz for
	// readiness and start-up.
	_, apiPort, _ := strings.Cut(cfg.APIAddr, ":")
	for name, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{
		"liveness": {fg.LivenessProbe, "/livez"}, "readiness": {fg.ReadinessProbe, "/readyz"}, "startup": {fg.StartupProbe, "/readyz"},
	} {
		if want.p == nil || want.p.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", name)
			continue
		}
		if want.p.HTTPGet.Path != want.path || fmt.Sprint(resolvePort(fg, want.p.HTTPGet.Port.String())) != apiPort {
			t.Errorf("%s probe asks %s on port %s; want %s on the lease API port %s", name, want.p.HTTPGet.Path, want.p.HTTPGet.Port.String(), want.path, apiPort)
		}
	}
	// The pod's grace period covers fencegate's drain.
	if pod.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds (the default 30s is implicit)")
	}
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	if budget := drainBudget(t, env); grace <= budget {
		t.Errorf("terminationGracePeriodSeconds %v is not above the drain (%v)", grace, budget)
	}
	if sc := fg.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("the fencegate container is not locked down (read-only root, no privilege escalation)")
	}
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Error("the pod does not require non-root")
	}

	// The scrape the annotations set up is the one the alerts select.
	ann := dep.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != apiPort || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v do not point at /metrics on the lease API port %s", ann, apiPort)
	}
	checkAlertsSelect(t, dep.Spec.Template.Labels)
}

// matches reports whether labels has every pair of sel.
func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// upSelector finds the label matchers of up{...} in an alert expression.
var upSelector = regexp.MustCompile(`\bup\{([^}]*)\}`)

// checkAlertsSelect: every up{...} of the alert rules selects series by
// labels the manifests' pods carry, as Prometheus's annotation-based pod
// scrape copies them (labelmap: dots, slashes and dashes become '_').
func checkAlertsSelect(t *testing.T, podLabels map[string]string) {
	t.Helper()
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := decodeYAMLStrictless("prometheus/fencegate-alerts.yml", &rules); err != nil {
		t.Fatal(err)
	}
	scraped := map[string]string{}
	for k, v := range podLabels {
		scraped[strings.NewReplacer(".", "_", "/", "_", "-", "_").Replace(k)] = v
	}
	found := false
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, m := range upSelector.FindAllStringSubmatch(r.Expr, -1) {
				found = true
				for _, matcher := range strings.Split(m[1], ",") {
					name, value, ok := strings.Cut(strings.TrimSpace(matcher), "=")
					value = strings.Trim(value, `"`)
					if !ok || strings.ContainsAny(name, "!~") || strings.HasPrefix(value, "~") || scraped[name] != value {
						t.Errorf("alert %s selects up{%s}, which the manifests' scrape (pod labels %v) does not produce", r.Alert, m[1], podLabels)
					}
				}
			}
		}
	}
	if !found {
		t.Error("no alert watches up{...} for the manifests' targets")
	}
}

// goMemLimit parses a GOMEMLIMIT value as the Go runtime does: a number
// of bytes with an optional unit B, KiB, MiB, GiB or TiB.
func goMemLimit(v string) (int64, error) {
	if v == "" {
		return 0, errors.New("not set: the sidecar has a memory limit and no soft limit for Go's collector")
	}
	num, unit := v, ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "B"} {
		if n, ok := strings.CutSuffix(v, u); ok {
			num, unit = n, u
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a number of bytes with a unit the Go runtime reads", v)
	}
	shift := map[string]uint{"": 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[unit]
	return n << shift, nil
}
