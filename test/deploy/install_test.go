//go:build deploytest

package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// podSpecsIn are the pod specs of every workload and Pod in objs.
func podSpecsIn(t *testing.T, objs []object) map[string]corev1.PodSpec {
	t.Helper()
	specs := map[string]corev1.PodSpec{}
	for key, o := range typedObjects(t, objs) {
		if tmpl, ok := podSpecOf(t, map[string]any{key: o}, key); ok {
			specs[key] = tmpl.Spec
		}
		if p, ok := o.(*corev1.Pod); ok {
			specs[key] = p.Spec
		}
	}
	return specs
}

func imagesOf(spec corev1.PodSpec) []string {
	var images []string
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		images = append(images, c.Name+"="+c.Image)
	}
	return images
}

// TestImageRegistryCoversEveryImage: one value, imageRegistry, moves every
// image the chart can run (carve in both roles and every node group,
// csi-provisioner, csi-snapshotter, csi-resizer, snapshot-controller, the
// helm test pod) to a mirror, keeping each image's path and tag. The
// control: without it, the images come from their own registries.
func TestImageRegistryCoversEveryImage(t *testing.T) {
	const mirror = "mirror.example:5000/carve-mirror"
	// renderValues keeps the helm test pod, which renderChart skips.
	const everything = "snapshotController: {enabled: true}\nnodeGroups: [{name: g, deviceClasses: [{name: fast, volumeGroup: nvme}]}]\n"
	render := func(values string) map[string]corev1.PodSpec {
		objs, err := renderValues(t, values)
		if err != nil {
			t.Fatal(err)
		}
		return podSpecsIn(t, objs)
	}
	defaults := render(everything)
	moved := render(everything + "imageRegistry: " + mirror + "\n")
	if _, ok := moved["Pod carve-system/carve-test-claim-binds"]; !ok {
		t.Errorf("the helm test pod is not among the rendered pods %v", sortedKeys(moved))
	}
	if len(moved) < 4 {
		t.Fatalf("rendered only %d pod specs: %v", len(moved), sortedKeys(moved))
	}
	var all []string
	for _, key := range sortedKeys(moved) {
		for i, img := range imagesOf(moved[key]) {
			all = append(all, img)
			name, ref, _ := strings.Cut(img, "=")
			rest, ok := strings.CutPrefix(ref, mirror+"/")
			if !ok {
				t.Errorf("%s: container %s runs %s, outside imageRegistry %s", key, name, ref, mirror)
				continue
			}
			_, orig, _ := strings.Cut(imagesOf(defaults[key])[i], "=")
			if !strings.HasSuffix(orig, "/"+rest) || strings.HasPrefix(orig, mirror) {
				t.Errorf("%s: container %s: the mirror's %s does not keep the path and tag of %s", key, name, ref, orig)
			}
		}
	}
	for _, want := range []string{"csi-provisioner", "csi-snapshotter", "csi-resizer", "snapshot-controller", "carve"} {
		if !slices.ContainsFunc(all, func(s string) bool { return strings.HasPrefix(s, want+"=") }) {
			t.Errorf("no container %s among the rendered images %q", want, all)
		}
	}
	t.Logf("%d images under %s", len(all), mirror)
}

// TestInstallsWithoutSnapshotCRDs: on a cluster that does not serve
// snapshot.storage.k8s.io/v1 the chart (and the kustomize base, which is
// the chart so rendered) contains no object of that API, so the install
// cannot fail on it, and installs no CRD unless crds.install asks; where
// the API is served, the VolumeSnapshotClass is there. csi-snapshotter
// stays: it waits for the API (and snapshots work once the CRDs arrive).
func TestInstallsWithoutSnapshotCRDs(t *testing.T) {
	noSnapshotObjects := func(t *testing.T, what string, objs []object) {
		t.Helper()
		for _, o := range objs {
			api, _ := o["apiVersion"].(string)
			if strings.HasPrefix(api, "snapshot.storage.k8s.io/") || o.kind() == "CustomResourceDefinition" {
				t.Errorf("%s renders %s (%s), which fails the install on a cluster without the snapshot CRDs", what, o.key(), api)
			}
		}
		d := byKey(t, objs)["Deployment carve-system/carve-controller"]
		if d == nil {
			t.Fatalf("%s renders no controller Deployment", what)
		}
		spec, _ := podSpecOf(t, typedObjects(t, []object{d}), d.key())
		if !slices.ContainsFunc(spec.Spec.Containers, func(c corev1.Container) bool { return c.Name == "csi-snapshotter" }) {
			t.Errorf("%s has no csi-snapshotter: snapshots would not start once the CRDs arrive", what)
		}
	}
	noSnapshotObjects(t, "the chart", renderChart(t))
	noSnapshotObjects(t, "the kustomize base", renderKustomize(t))

	// The control: where the API is served, the class is rendered.
	with := byKey(t, renderChart(t, "--api-versions=snapshot.storage.k8s.io/v1"))
	if _, ok := with["VolumeSnapshotClass /carve"]; !ok {
		t.Errorf("with snapshot.storage.k8s.io/v1 served, the chart renders no VolumeSnapshotClass carve: %v", sortedKeys(with))
	}
}

// TestCRDsOnlyWhenAsked: the chart installs the cluster-wide snapshot CRDs
// only with crds.install=true, then the pinned release's files, kept on
// uninstall; it has no crds/ directory, which Helm would always install.
func TestCRDsOnlyWhenAsked(t *testing.T) {
	root := repoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "deploy", "helm", "carve", "crds")); err == nil {
		t.Error("deploy/helm/carve/crds exists: Helm installs everything there whatever crds.install says")
	}
	for _, o := range renderChart(t) {
		if o.kind() == "CustomResourceDefinition" {
			t.Errorf("the default chart installs %s", o.key())
		}
	}
	var names []string
	for _, o := range renderChart(t, "crds.install=true") {
		if o.kind() != "CustomResourceDefinition" {
			continue
		}
		names = append(names, o.meta("name"))
		md, _ := o["metadata"].(map[string]any)
		ann, _ := md["annotations"].(map[string]any)
		if ann["helm.sh/resource-policy"] != "keep" {
			t.Errorf("%s has no helm.sh/resource-policy: keep: uninstalling carve would delete every VolumeSnapshot", o.key())
		}
	}
	slices.Sort(names)
	want := []string{"volumesnapshotclasses.snapshot.storage.k8s.io", "volumesnapshotcontents.snapshot.storage.k8s.io", "volumesnapshots.snapshot.storage.k8s.io"}
	if !slices.Equal(names, want) {
		t.Errorf("crds.install=true renders CRDs %q, want %q", names, want)
	}
}
