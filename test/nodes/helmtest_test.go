//go:build nodes

package nodes

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestHelmTestHookPasses: the chart's `helm test` hook (a claim of the
// first StorageClass and a pod that writes to it and reads it back), as
// `helm template` renders it with the chart's defaults, succeeds on the
// real node: the claim binds to a volume carve made there, and the pod
// ends Succeeded. The bed installs the kustomize base, which is rendered
// from the same chart, so the hook's image and class are the bed's.
// helm itself is not asked to run it: `helm test` needs a release, and
// the bed is not one.
func TestHelmTestHookPasses(t *testing.T) {
	helm := filepath.Join(os.Getenv("CARVE_CACHE"), "bin", "helm")
	if _, err := os.Stat(helm); os.Getenv("CARVE_CACHE") == "" || err != nil {
		t.Fatalf("helm is missing (CARVE_CACHE=%q, %v): run make test-nodes, which installs it", os.Getenv("CARVE_CACHE"), err)
	}
	ns := newNamespace(t, "helm-test")
	ctx := testCtx(t, 5*time.Minute)
	server, err := bed.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	// helm template checks the chart's kubeVersion against the version it
	// is given (its own default is old): the bed's, as helm test would.
	cmd := exec.CommandContext(ctx, helm, "template", "carve", filepath.Join("..", "..", "deploy", "helm", "carve"),
		"--namespace", ns, "--kube-version", server.GitVersion, "--show-only", "templates/tests/claim-binds.yaml")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	pvc, pod := hookObjects(t, out)
	if got := pod.Spec.Containers[0].Image; got != carveImage {
		t.Fatalf("the hook's pod runs %s, the bed loaded %s: the chart's default image and the kustomize base's differ", got, carveImage)
	}
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bed.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podTimeout, "the hook's pod to succeed", func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		if p.Status.Phase == corev1.PodFailed {
			return false, "", fmt.Errorf("the hook's pod failed: %s", podState(p))
		}
		return p.Status.Phase == corev1.PodSucceeded, podState(p), nil
	})
	pv := pvOf(t, ns, pvc.Name)
	if lvState(t, volumeHandle(t, pv)) == "" {
		t.Errorf("the hook's claim is bound to %s, but its LV is not on %s", pv, nodeName)
	}
}

// hookObjects decodes the hook's claim and pod from helm's output.
func hookObjects(t *testing.T, rendered []byte) (*corev1.PersistentVolumeClaim, *corev1.Pod) {
	t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	var pod *corev1.Pod
	for _, doc := range strings.Split(string(rendered), "\n---") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("the rendered hook: %v\n%s", err, doc)
		}
		switch meta.Kind {
		case "PersistentVolumeClaim":
			pvc = &corev1.PersistentVolumeClaim{}
			if err := yaml.UnmarshalStrict([]byte(doc), pvc); err != nil {
				t.Fatalf("the hook's claim: %v", err)
			}
		case "Pod":
			pod = &corev1.Pod{}
			if err := yaml.UnmarshalStrict([]byte(doc), pod); err != nil {
				t.Fatalf("the hook's pod: %v", err)
			}
		case "":
		default:
			t.Fatalf("the hook renders a %s; this test knows a claim and a pod", meta.Kind)
		}
	}
	if pvc == nil || pod == nil || len(pod.Spec.Containers) == 0 {
		t.Fatalf("the hook rendered no claim and pod:\n%s", rendered)
	}
	return pvc, pod
}
