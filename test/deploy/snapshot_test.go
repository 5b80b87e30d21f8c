//go:build deploytest

package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// snapshotterModule is the external-snapshotter module whose
// csi-snapshotter and snapshot-controller the tests build, and
// snapshotClientModule the one that holds its CRDs
// (test/tools/snapshotter/go.mod pins both at one release).
const (
	snapshotterModule    = "github.com/kubernetes-csi/external-snapshotter/v8"
	snapshotClientModule = "github.com/kubernetes-csi/external-snapshotter/client/v8"
)

// snapshotCRDs are the CRD files carve ships (volume group snapshots aside:
// carve has none).
var snapshotCRDs = []string{
	"snapshot.storage.k8s.io_volumesnapshotclasses.yaml",
	"snapshot.storage.k8s.io_volumesnapshotcontents.yaml",
	"snapshot.storage.k8s.io_volumesnapshots.yaml",
}

// pinnedVersion returns the version test/tools/snapshotter/go.mod
// requires of module.
func pinnedVersion(t *testing.T, module string) string {
	t.Helper()
	data := readRepoFile(t, "test", "tools", "snapshotter", "go.mod")
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	t.Fatalf("test/tools/snapshotter/go.mod requires no %s", module)
	return ""
}

// TestSnapshotCRDsFromPinnedModule: the CRDs in the chart are the pinned
// release's, byte for byte, under the comment hack/snapshot-crds.sh writes
// (TestManifestsGenerated checks deploy/kubernetes/snapshot-controller's
// copies of them), and the tools module pins the binaries and the CRDs at
// one release.
func TestSnapshotCRDsFromPinnedModule(t *testing.T) {
	root := repoRoot(t)
	version := pinnedVersion(t, snapshotClientModule)
	if v := pinnedVersion(t, snapshotterModule); v != version {
		t.Errorf("test/tools/snapshotter pins %s %s but %s %s: binaries and CRDs from two releases", snapshotterModule, v, snapshotClientModule, version)
	}
	toolsDir := filepath.Join(root, "test", "tools", "snapshotter")
	run(t, toolsDir, "go", "mod", "download", snapshotClientModule)
	modDir := strings.TrimSpace(string(run(t, toolsDir, "go", "list", "-m", "-f", "{{.Dir}}", snapshotClientModule)))
	for _, name := range snapshotCRDs {
		orig, err := os.ReadFile(filepath.Join(modDir, "config", "crd", name))
		if err != nil {
			t.Fatal(err)
		}
		want := "# From the Go module " + snapshotClientModule + "@" + version + ", file config/crd/" + name + "\n" +
			"# (copied by hack/snapshot-crds.sh; do not edit).\n" + string(orig)
		got, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "carve", "files", "snapshot-crds", name))
		if err != nil {
			t.Errorf("%v (hack/snapshot-crds.sh copies it)", err)
			continue
		}
		if string(got) != want {
			t.Errorf("deploy/helm/carve/files/snapshot-crds/%s is not %s@%s's config/crd/%s: run hack/snapshot-crds.sh and make manifests", name, snapshotClientModule, version, name)
		}
	}
	// files/snapshot-crds holds nothing else: crds.install renders every file there.
	files, err := filepath.Glob(filepath.Join(root, "deploy", "helm", "carve", "files", "snapshot-crds", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	if !slices.Equal(names, snapshotCRDs) {
		t.Errorf("deploy/helm/carve/files/snapshot-crds holds %q, want %q", names, snapshotCRDs)
	}
}

// renderSnapshotController builds deploy/kubernetes/snapshot-controller.
func renderSnapshotController(t *testing.T) []object {
	t.Helper()
	root := repoRoot(t)
	return decodeObjects(t, run(t, root, tool(t, "kustomize"), "build", filepath.Join(root, "deploy", "kubernetes", "snapshot-controller")))
}

// TestSnapshotControllerManifests: the optional snapshot-controller runs the
// pinned release without distributed snapshotting (carve's csi-snapshotter
// runs once, in the controller Deployment), with exactly the permissions
// it needs, and the chart renders the same objects with
// snapshotController.enabled=true (and none by default).
func TestSnapshotControllerManifests(t *testing.T) {
	version := pinnedVersion(t, snapshotterModule)
	image := "registry.k8s.io/sig-storage/snapshot-controller:" + version
	all := renderSnapshotController(t)
	crds := map[string]object{}
	rest := map[string]object{}
	typedObjs := map[string]runtime.Object{}
	for _, o := range all {
		if o.kind() == "CustomResourceDefinition" {
			crds[o.key()] = o
			continue
		}
		rest[o.key()] = o
		typedObjs[o.key()] = typed(t, o)
	}
	wantCRDs := []string{
		"CustomResourceDefinition /volumesnapshotclasses.snapshot.storage.k8s.io",
		"CustomResourceDefinition /volumesnapshotcontents.snapshot.storage.k8s.io",
		"CustomResourceDefinition /volumesnapshots.snapshot.storage.k8s.io",
	}
	if got := sortedKeys(crds); !slices.Equal(got, wantCRDs) {
		t.Errorf("CRDs %q, want %q", got, wantCRDs)
	}

	d := get[*appsv1.Deployment](t, typedObjs, "Deployment kube-system/carve-snapshot-controller")
	spec := d.Spec.Template.Spec
	c := container(t, spec, "snapshot-controller")
	if c.Image != image {
		t.Errorf("snapshot-controller runs %s, want %s (the release test/tools/snapshotter pins)", c.Image, image)
	}
	if !slices.Contains(c.Args, "--leader-election") {
		t.Errorf("snapshot-controller args %q lack --leader-election", c.Args)
	}
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--enable-distributed-snapshotting") }) {
		t.Errorf("snapshot-controller args %q ask for distributed snapshotting, which only a csi-snapshotter per node needs", c.Args)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("snapshot-controller has no CPU or memory request")
	}
	if spec.ServiceAccountName != "carve-snapshot-controller" {
		t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
	}
	checkGrants(t, typedObjs, map[string][]rule{
		"kube-system/carve-snapshot-controller": slices.Concat(
			expand("cluster", "", "persistentvolumes", "get", "list", "watch"),
			expand("cluster", "", "persistentvolumeclaims", "get", "list", "watch", "update"),
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshotclasses", "get", "list", "watch"),
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshotcontents", "get", "list", "watch", "create", "update", "patch", "delete"),
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshotcontents/status", "patch"),
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshots", "get", "list", "watch", "update", "patch"),
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshots/status", "update", "patch"),
			expand("cluster", "", "events", "list", "watch", "create", "update", "patch"),
			expand("namespace", "coordination.k8s.io", "leases", "get", "list", "watch", "create", "update", "delete"),
		),
	})

	doc := readRepoFile(t, "docs", "install.md")
	if !bytes.Contains(doc, []byte(image)) {
		t.Errorf("docs/install.md does not mention %s", image)
	}

	// The chart: nothing by default, the same objects when enabled.
	isSnapshotController := func(o object) bool {
		md, _ := o["metadata"].(map[string]any)
		labels, _ := md["labels"].(map[string]any)
		return labels["app.kubernetes.io/component"] == "snapshot-controller"
	}
	for _, o := range renderChart(t) {
		if isSnapshotController(o) {
			t.Errorf("the chart renders %s with default values", o.key())
		}
	}
	chart := map[string]object{}
	for _, o := range renderChart(t, "snapshotController.enabled=true") {
		if isSnapshotController(o) {
			chart[o.key()] = o
		}
	}
	if d := compareRenderings(t, rest, chart); len(d) > 0 {
		t.Errorf("the chart's snapshot-controller differs from deploy/kubernetes/snapshot-controller:\n%s", strings.Join(d, "\n"))
	}
	// The chart renders the CRDs with crds.install=true, marked for Helm
	// to keep on uninstall (the only difference).
	chartCRDs := map[string]object{}
	for _, o := range renderChart(t, "crds.install=true") {
		if o.kind() == "CustomResourceDefinition" {
			md, _ := o["metadata"].(map[string]any)
			ann, _ := md["annotations"].(map[string]any)
			delete(ann, "helm.sh/resource-policy")
			chartCRDs[o.key()] = o
		}
	}
	if d := compareRenderings(t, crds, chartCRDs); len(d) > 0 {
		t.Errorf("the chart's CRDs differ from deploy/kubernetes/snapshot-controller's:\n%s", strings.Join(d, "\n"))
	}
}
