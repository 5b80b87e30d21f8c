//go:build e2e

package e2e

import (
	"os"
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
		return strings.TrimSpace(output(t, exec.CommandContext(ctx, kubectl, argv...), "kubectl "+strings.Join(args, " ")))
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

// TestKubectlRunsCarvePlugin: with bin/ on PATH (where make build puts
// kubectl-carve and kubectl_complete-carve), kubectl runs `kubectl carve`
// with the flags after the plugin's name, and completes its commands and
// claim names through kubectl_complete-carve (kubectl 1.26 and later).
func TestKubectlRunsCarvePlugin(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	kubectl := filepath.Join(bed.Config.BinDir, "kubectl")
	binDir := filepath.Dir(os.Getenv("CARVE_BIN"))
	for _, name := range []string{"kubectl-carve", "kubectl_complete-carve"} {
		if _, err := os.Stat(filepath.Join(binDir, name)); err != nil {
			t.Fatalf("%s is not beside CARVE_BIN (%v): run `make build`", name, err)
		}
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, kubectl, args...)
		cmd.Env = append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+bed.Control.Kubeconfig)
		return output(t, cmd, "kubectl "+strings.Join(args, " "))
	}

	if out := run("carve", "--help"); !strings.Contains(out, "kubectl carve [command]") {
		t.Errorf("kubectl carve --help:\n%s", out)
	}
	var want []string
	for _, n := range bed.Nodes {
		want = append(want, "node/"+n.Name)
	}
	got := strings.Fields(run("carve", "nodes", "-o", "name"))
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("kubectl carve nodes -o name = %q, lacks %s", got, w)
		}
	}
	if out := run("__complete", "carve", "no"); !strings.HasPrefix(out, "nodes") {
		t.Errorf("kubectl __complete carve no:\n%s\nwant nodes (from kubectl_complete-carve)", out)
	}

	ns := newNamespace(t, "kcomplete")
	createPVCAndPod(t, ctx, newPVC(ns, "claim-to-complete", thickSC, "1Gi"), newPod(ns, "app", "claim-to-complete"))
	if out := run("__complete", "carve", "describe", "-n", ns, "claim-"); !strings.HasPrefix(out, "claim-to-complete") {
		t.Errorf("kubectl __complete carve describe -n %s claim-:\n%s\nwant claim-to-complete", ns, out)
	}
}
