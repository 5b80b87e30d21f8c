//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/carve-csi/carve/test/harness/cluster"
)

// TestInstallFromReleaseArtifacts: what a user installs from a release,
// the artifacts of v0.1.0-rc.1 (hack/release.sh, as make
// release-artifacts and the release workflow run it), installs on a
// control plane of its own (beside the test bed, whose objects it must
// not touch; no nodes, so no pod runs): helm install of the chart
// archive creates every object it renders, with the release's image;
// helm upgrade with crds.install=true adds the snapshot CRDs, and the
// next upgrade the VolumeSnapshotClass they serve; after helm uninstall,
// kubectl apply --server-side of the release manifest creates every
// object of it. The helm test hook is not run here: its pod needs a
// kubelet (the nodes tier's TestHelmTestHookPasses runs it).
func TestInstallFromReleaseArtifacts(t *testing.T) {
	const version, semver = "v0.1.0-rc.1", "0.1.0-rc.1"
	ctx := testCtx(t, 8*time.Minute)
	cache := os.Getenv("CARVE_CACHE")
	helm := filepath.Join(cache, "bin", "helm")
	if _, err := os.Stat(helm); cache == "" || err != nil {
		t.Fatalf("helm is missing (CARVE_CACHE=%q, %v): run make test-e2e, which installs it (make deploy-tools)", cache, err)
	}

	// The artifacts, for this machine's platform only (test/deploy's
	// TestReleasePlugin builds and checks all of them).
	dir := t.TempDir()
	changelog := filepath.Join(dir, "CHANGELOG.md")
	if err := os.WriteFile(changelog, []byte("# Changelog\n\n## ["+semver+"]\n\n- the first release candidate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dist := filepath.Join(dir, "dist")
	rel := exec.CommandContext(ctx, filepath.Join("..", "..", "hack", "release.sh"), "artifacts")
	rel.Env = append(os.Environ(), "VERSION="+version, "DIST="+dist, "CHANGELOG="+changelog, "PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH)
	if out, err := rel.CombinedOutput(); err != nil {
		t.Fatalf("hack/release.sh artifacts: %v\n%s", err, out)
	}

	cp, err := cluster.StartControlPlane(ctx, bed.Config.BinDir, filepath.Join(dir, "control-plane"), 10*time.Minute)
	if err != nil {
		t.Fatalf("a control plane for the install: %v", err)
	}
	t.Cleanup(cp.Stop)
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	cmd := func(argv ...string) string {
		t.Helper()
		c := exec.CommandContext(ctx, argv[0], argv[1:]...)
		c.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig, "HELM_CACHE_HOME="+filepath.Join(dir, "helm"), "HELM_CONFIG_HOME="+filepath.Join(dir, "helm"), "HELM_DATA_HOME="+filepath.Join(dir, "helm"))
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
		return string(out)
	}
	// present checks that every object of a rendering exists and that the
	// workloads run the release's image.
	present := func(what string, m *cluster.Manifests) {
		t.Helper()
		missing, err := m.Missing(ctx, cp.Config)
		if err != nil {
			t.Fatal(err)
		}
		if len(missing) > 0 {
			t.Errorf("%s: objects the apiserver does not hold: %v", what, missing)
		}
		d, err := m.ControllerDeployment()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := d.Spec.Template.Spec.Containers[0].Image; got != "ghcr.io/carve-csi/carve:"+version {
			t.Errorf("%s: the controller runs %s, want ghcr.io/carve-csi/carve:%s", what, got, version)
		}
		t.Logf("%s: %d objects created", what, len(m.Objects))
	}
	release := func() *cluster.Manifests {
		t.Helper()
		m, err := cluster.ParseManifests([]byte(cmd(helm, "get", "manifest", "carve", "--namespace", "carve-system")), "the helm release")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	snapshotClass := schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}

	chart := filepath.Join(dist, "carve-"+semver+".tgz")
	cmd(helm, "install", "carve", chart, "--namespace", "carve-system", "--create-namespace")
	present("helm install", release())
	if _, err := dyn.Resource(snapshotClass).Get(ctx, "carve", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("without the snapshot CRDs the VolumeSnapshotClass carve: %v, want the API not found", err)
	}

	// crds.install: the CRDs on the first upgrade, established; the
	// VolumeSnapshotClass they serve on the next (Helm checks every object
	// against the API before it creates any).
	cmd(helm, "upgrade", "carve", chart, "--namespace", "carve-system", "--set", "crds.install=true")
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, name := range []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"} {
		name += ".snapshot.storage.k8s.io"
		waitFor(t, settle, "CRD "+name+" established", func(ctx context.Context) (bool, string, error) {
			u, err := crds.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, "absent", nil
			}
			if err != nil {
				return false, "", err
			}
			conditions, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			var conds []string
			for _, c := range conditions {
				c, _ := c.(map[string]any)
				if c["type"] == "Established" && c["status"] == "True" {
					return true, "", nil
				}
				conds = append(conds, fmt.Sprintf("%v=%v", c["type"], c["status"]))
			}
			return false, strings.Join(conds, ","), nil
		})
	}
	cmd(helm, "upgrade", "carve", chart, "--namespace", "carve-system", "--set", "crds.install=true")
	m := release()
	present("helm upgrade --set crds.install=true", m)
	if len(m.Find("VolumeSnapshotClass")) != 1 || len(m.Find("CustomResourceDefinition")) != 3 {
		t.Errorf("the upgraded release has %d VolumeSnapshotClasses and %d CRDs, want 1 and 3", len(m.Find("VolumeSnapshotClass")), len(m.Find("CustomResourceDefinition")))
	}
	if _, err := dyn.Resource(snapshotClass).Get(ctx, "carve", metav1.GetOptions{}); err != nil {
		t.Errorf("the VolumeSnapshotClass carve after the second upgrade: %v", err)
	}

	// The release manifest, on the same control plane once the chart is
	// gone (its CRDs stay: helm.sh/resource-policy keep).
	cmd(helm, "uninstall", "carve", "--namespace", "carve-system", "--wait")
	for _, name := range []string{"carve-controller", "carve-node"} {
		waitFor(t, settle, "ServiceAccount "+name+" deleted by helm uninstall", func(ctx context.Context) (bool, string, error) {
			_, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}).Namespace("carve-system").Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err), nil
		})
	}
	if _, err := crds.Get(ctx, "volumesnapshots.snapshot.storage.k8s.io", metav1.GetOptions{}); err != nil {
		t.Errorf("helm uninstall removed the snapshot CRDs (they must stay): %v", err)
	}
	manifest := filepath.Join(dist, "carve-"+version+".yaml")
	raw, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	mm, err := cluster.ParseManifests(raw, "the release manifest")
	if err != nil {
		t.Fatal(err)
	}
	out := cmd(filepath.Join(bed.Config.BinDir, "kubectl"), "apply", "--server-side", "--field-manager=carve-e2e", "-f", manifest)
	if n := strings.Count(out, " serverside-applied"); n != len(mm.Objects) {
		t.Errorf("kubectl apply --server-side applied %d objects, the manifest has %d:\n%s", n, len(mm.Objects), out)
	}
	present("kubectl apply --server-side -f "+filepath.Base(manifest), mm)
	if slices.ContainsFunc(mm.Objects, func(o *unstructured.Unstructured) bool { return o.GetKind() == "VolumeSnapshotClass" }) {
		t.Error("the release manifest holds a VolumeSnapshotClass: it would not install on a cluster without the snapshot CRDs")
	}
}
