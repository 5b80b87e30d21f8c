//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/carve-csi/carve/test/harness/cluster"
)

// TestShippedManifestsAccepted: every object of deploy/kubernetes was
// accepted by the apiserver (TestMain created them with strict field
// validation), the node DaemonSet has one pod bound per node, and the
// controller Deployment's pod is scheduled. Their containers never start:
// no kubelet runs.
func TestShippedManifestsAccepted(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	missing, err := bed.Manifests.Missing(ctx, bed.Control.Config)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("objects of deploy/kubernetes the apiserver does not hold: %v", missing)
	}
	t.Logf("%d objects of deploy/kubernetes accepted", len(bed.Manifests.Objects))

	for _, kind := range []string{"DaemonSet", "Deployment"} {
		for _, o := range bed.Manifests.Find(kind) {
			var sel *metav1.LabelSelector
			want := 1
			switch kind {
			case "DaemonSet":
				ds := &appsv1.DaemonSet{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
					t.Fatal(err)
				}
				sel, want = ds.Spec.Selector, len(bed.Nodes)
			case "Deployment":
				d := &appsv1.Deployment{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d); err != nil {
					t.Fatal(err)
				}
				sel = d.Spec.Selector
				if d.Spec.Replicas != nil {
					want = int(*d.Spec.Replicas)
				}
			}
			s, err := metav1.LabelSelectorAsSelector(sel)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, settle, fmt.Sprintf("%d pod(s) of %s %s bound to nodes", want, kind, o.GetName()), func(ctx context.Context) (bool, string, error) {
				return podsBound(ctx, o.GetNamespace(), s, want, kind == "DaemonSet")
			})
		}
	}
}

// podsBound tells whether exactly want pods match sel and all are bound to
// a node; with perNode, each to a different node.
func podsBound(ctx context.Context, ns string, sel labels.Selector, want int, perNode bool) (bool, string, error) {
	pods, err := bed.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return false, "", err
	}
	nodes := map[string]bool{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			nodes[p.Spec.NodeName] = true
		}
	}
	bound := 0
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			bound++
		}
	}
	ok := bound == want && len(pods.Items) == want && (!perNode || len(nodes) == want)
	return ok, fmt.Sprintf("%d pods, %d bound, on %d nodes", len(pods.Items), bound, len(nodes)), nil
}

// TestChartWithOptionsAccepted: the Helm chart rendered with its options
// turned on (node groups, logging, extra arguments and environment, pod
// labels and annotations, probes, security contexts, rollout, StorageClass
// mount options and labels) is accepted by the apiserver with strict field
// validation (a dry-run create of every object; the base itself was
// created for real by TestMain). helm is make deploy-tools' (test-e2e
// depends on it).
func TestChartWithOptionsAccepted(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	cache := os.Getenv("CARVE_CACHE")
	helm := filepath.Join(cache, "bin", "helm")
	if _, err := os.Stat(helm); cache == "" || err != nil {
		t.Fatalf("helm is missing (CARVE_CACHE=%q, %v): run make test-e2e, which installs it (make deploy-tools)", cache, err)
	}
	values := `
logFormat: json
nodeGroups:
  - name: nvme
    deviceClasses: [{name: fast, volumeGroup: nvme, default: true, spare: 1Gi}]
    tolerations: [{key: dedicated, operator: Equal, value: db, effect: NoSchedule}]
    resources: {requests: {cpu: 100m, memory: 64Mi}}
storageClasses:
  - {name: carve-e2e-fast, deviceClass: fast, fsType: xfs, mountOptions: [noatime], labels: {team: db}, annotations: {example.com/a: x}, parameters: {csi.storage.k8s.io/node-stage-secret-name: q}}
node:
  logLevel: 4
  extraArgs: [--lvm-timeout=5m]
  extraEnv: [{name: EXAMPLE, value: "1"}]
  podLabels: {team: storage}
  podAnnotations: {example.com/b: "y"}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 2, maxSurge: 0}}
  livenessProbe: {httpGet: {path: /healthz, port: metrics}, periodSeconds: 7}
controller:
  replicas: 2
  logLevel: 3
  extraArgs: [--driver-name=lvm.carve.dev]
  podLabels: {team: storage}
  podDisruptionBudget: {maxUnavailable: 1}
sidecars:
  provisioner: {logLevel: 5, extraArgs: [--worker-threads=20]}
  resizer: {logLevel: 2}
`
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, helm, "template", "carve", filepath.Join("..", "..", "deploy", "helm", "carve"),
		"--namespace", bed.Manifests.Find("DaemonSet")[0].GetNamespace(), "--kube-version", "v1.34.0", "-f", f).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	m, err := cluster.ParseManifests(out, "the chart with options")
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Find("DaemonSet")) != 2 || len(m.Find("PodDisruptionBudget")) != 1 {
		t.Fatalf("the rendering has %d DaemonSets and %d PodDisruptionBudgets, want 2 and 1", len(m.Find("DaemonSet")), len(m.Find("PodDisruptionBudget")))
	}
	if err := m.DryRun(ctx, bed.Control.Config); err != nil {
		t.Fatalf("the apiserver refuses the chart rendered with options: %v", err)
	}
	t.Logf("%d objects of the chart with options accepted (dry run)", len(m.Objects))

	// The control: a field the API does not have is refused, so the dry
	// run above cannot pass by validating nothing.
	bad := m.Find("DaemonSet")[1].DeepCopy()
	bad.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["nodeSelecter"] = map[string]any{"a": "b"}
	if err := (&cluster.Manifests{Objects: []*unstructured.Unstructured{bad}}).DryRun(ctx, bed.Control.Config); err == nil || !strings.Contains(err.Error(), "nodeSelecter") {
		t.Errorf("a DaemonSet with the unknown field nodeSelecter: %v, want a strict-validation error naming it", err)
	}
}
