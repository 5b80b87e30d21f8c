//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
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
