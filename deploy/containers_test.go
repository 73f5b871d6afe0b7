package deploy

// Every container the overlays run, and the Valkey server's memory: what
// deploy/kustomize_test.go checks of the fencegate sidecar, for the rest.

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// overlayDeployments renders an overlay as kubectl apply -k would and returns
// its Deployments.
func overlayDeployments(t *testing.T, overlay string) []appsv1.Deployment {
	t.Helper()
	dir := "kubernetes/overlays/" + overlay
	deps, _, _, _, _, _ := k8sObjects(t, dir, render(t, dir))
	return deps
}

// TestValkeyMaxmemoryBelowItsLimit: the replicated overlay's Valkey runs
// with --maxmemory-policy noeviction (as fencegate requires) under a
// container memory limit, so it needs a --maxmemory below that limit:
// with Valkey's default (none) noeviction never applies, and Valkey grows
// until the kernel ends it at the limit, then reloads the same AOF and is
// ended again (every gate and lease call 503 meanwhile; docs/stores.md
// measures 290 MB for 1,000,000 resources). At its maxmemory Valkey
// refuses new keys, which fencegate answers as store-unavailable.
func TestValkeyMaxmemoryBelowItsLimit(t *testing.T) {
	checked := 0
	defer func() {
		if checked == 0 {
			t.Error("no Valkey container with a memory limit in the replicated overlay: nothing checked")
		}
	}()
	for _, d := range overlayDeployments(t, "replicated") {
		for _, c := range d.Spec.Template.Spec.Containers {
			if !strings.Contains(c.Image, "valkey") && !strings.Contains(c.Image, "redis") {
				continue
			}
			limit, hasLimit := c.Resources.Limits[corev1.ResourceMemory]
			if !hasLimit {
				continue
			}
			checked++
			args := append(append([]string{}, c.Command...), c.Args...)
			maxmem := ""
			for i, a := range args {
				if a == "--maxmemory" && i+1 < len(args) {
					maxmem = args[i+1]
				}
			}
			if maxmem == "" {
				t.Errorf("Deployment %s container %s: memory limit %s but no --maxmemory (args %q): noeviction never applies, the kernel OOM-kills Valkey at the limit instead of Valkey refusing writes",
					d.Name, c.Name, limit.String(), c.Args)
				continue
			}
			// Valkey reads 100mb, 100mib, 1gb... ; accept the plain forms here.
			q, err := resource.ParseQuantity(strings.NewReplacer("gb", "G", "mb", "M", "kb", "k", "gib", "Gi", "mib", "Mi", "kib", "Ki").Replace(strings.ToLower(maxmem)))
			if err != nil {
				t.Errorf("Deployment %s container %s: --maxmemory %q not understood: %v", d.Name, c.Name, maxmem, err)
				continue
			}
			// Leave room for the AOF rewrite's fork and the server's own overhead.
			if float64(q.Value()) > 0.75*float64(limit.Value()) {
				t.Errorf("Deployment %s container %s: --maxmemory %s is above 75%% of the memory limit %s", d.Name, c.Name, maxmem, limit.String())
			}
		}
	}
}

// TestEveryContainerLockedDown: every container of both overlays, the
// example service a user replaces with theirs included, runs on a
// read-only root file system, without privilege escalation, under a
// memory limit (an unbounded service gets the pod evicted, the fencegate
// sidecar with it).
func TestEveryContainerLockedDown(t *testing.T) {
	for _, overlay := range []string{"single", "replicated"} {
		checked := 0
		for _, d := range overlayDeployments(t, overlay) {
			spec := d.Spec.Template.Spec
			for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
				checked++
				sc := c.SecurityContext
				if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("overlay %s, Deployment %s container %s: writable root file system", overlay, d.Name, c.Name)
				}
				if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("overlay %s, Deployment %s container %s: privilege escalation allowed", overlay, d.Name, c.Name)
				}
				if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
					t.Errorf("overlay %s, Deployment %s container %s: no memory limit", overlay, d.Name, c.Name)
				}
			}
		}
		if checked < 2 { // the fencegate sidecar and the example service at least
			t.Errorf("overlay %s: %d containers checked, want the sidecar and the service at least", overlay, checked)
		}
	}
}
