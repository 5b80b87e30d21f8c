//go:build e2e

package e2e

import (
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubectlReadsTheCluster: the kubectl that hack/e2e-tools.sh builds,
// and that `make demo` tells people to use, talks to the test bed with its
// kubeconfig and sees what client-go sees: carve's CSIDriver and the same
// CSIStorageCapacity objects.
func TestKubectlReadsTheCluster(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	kubectl := filepath.Join(bed.Config.BinDir, "kubectl")
	run := func(args ...string) string {
		t.Helper()
		argv := append([]string{"--kubeconfig", bed.Control.Kubeconfig}, args...)
		out, err := exec.CommandContext(ctx, kubectl, argv...).Output()
		if err != nil {
			var stderr string
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				stderr = string(exitErr.Stderr)
			}
			t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr)
		}
		return strings.TrimSpace(string(out))
	}

	if got := run("get", "csidriver", "lvm.carve.dev", "-o", "jsonpath={.spec.storageCapacity}"); got != "true" {
		t.Errorf("kubectl get csidriver lvm.carve.dev: storageCapacity %q, want true", got)
	}

	listed, err := bed.Client.StorageV1().CSIStorageCapacities(bed.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range listed.Items {
		want = append(want, "csistoragecapacity.storage.k8s.io/"+c.Name)
	}
	got := strings.Fields(run("get", "csistoragecapacities", "-n", bed.Namespace, "-o", "name"))
	slices.Sort(want)
	slices.Sort(got)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("kubectl lists capacities %v; client-go lists %v", got, want)
	}
}
