//go:build deploytest

package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// helmLabels are the labels only the chart sets (Helm's conventions); the
// comparison with the kustomize base ignores them.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// onlyInBase are the objects the chart does not render on purpose: Helm
// stores its release in the release namespace before it creates anything,
// so the namespace must exist first (`helm install --create-namespace`).
var onlyInBase = map[string]string{
	"Namespace /carve-system": "Helm needs the release namespace before it installs; use --create-namespace",
}

// normalize removes what the comparison ignores: Helm's own labels, and the
// formatting of YAML files inside ConfigMaps (compared as data).
func normalize(t *testing.T, o object) object {
	t.Helper()
	var c object
	b, _ := json.Marshal(o)
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if md, ok := c["metadata"].(map[string]any); ok {
		if labels, ok := md["labels"].(map[string]any); ok {
			for _, l := range helmLabels {
				delete(labels, l)
			}
		}
	}
	if c.kind() == "ConfigMap" {
		if data, ok := c["data"].(map[string]any); ok {
			for k, v := range data {
				s, _ := v.(string)
				if !strings.HasSuffix(k, ".yaml") {
					continue
				}
				var parsed any
				if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
					t.Fatalf("%s: %s is not YAML: %v", o.key(), k, err)
				}
				data[k] = parsed
			}
		}
	}
	return c
}

// diff lists the paths where a and b differ.
func diff(path string, a, b any, out *[]string) {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s: %v != %v", path, a, b))
			return
		}
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			diff(path+"."+k, av[k], bv[k], out)
		}
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			*out = append(*out, fmt.Sprintf("%s: %v != %v", path, a, b))
			return
		}
		for i := range av {
			diff(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i], out)
		}
	default:
		if !reflect.DeepEqual(a, b) {
			*out = append(*out, fmt.Sprintf("%s: %v != %v", path, a, b))
		}
	}
}

// compareRenderings lists every difference between two object sets.
func compareRenderings(t *testing.T, base, chart map[string]object) (differences []string) {
	for _, k := range sortedKeys(base) {
		c, ok := chart[k]
		if !ok {
			differences = append(differences, "only in the kustomize base: "+k)
			continue
		}
		var d []string
		diff("", map[string]any(normalize(t, base[k])), map[string]any(normalize(t, c)), &d)
		for _, line := range d {
			differences = append(differences, k+line)
		}
	}
	for _, k := range sortedKeys(chart) {
		if _, ok := base[k]; !ok {
			differences = append(differences, "only in the chart: "+k)
		}
	}
	return differences
}

func TestHelmLint(t *testing.T) {
	root := repoRoot(t)
	chart := filepath.Join(root, "deploy", "helm", "carve")
	for _, set := range [][]string{
		nil,
		{"metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true", "dashboard.enabled=true"},
		{"snapshotController.enabled=true"},
	} {
		argv := []string{tool(t, "helm"), "lint", "--strict", chart}
		for _, s := range set {
			argv = append(argv, "--set", s)
		}
		out := run(t, root, argv...)
		if !bytes.Contains(out, []byte("0 chart(s) failed")) {
			t.Errorf("helm lint %v:\n%s", set, out)
		}
	}
}

// TestManifestsGenerated: the kustomize base is what `make manifests`
// renders from the chart now. The generator runs into a temporary
// directory; every file it writes must equal the committed one, and every
// committed file that says it is generated must still be written.
func TestManifestsGenerated(t *testing.T) {
	root := repoRoot(t)
	out := t.TempDir()
	monOut := t.TempDir()
	run(t, root, "go", "run", "./hack/manifests", "--helm", tool(t, "helm"),
		"--chart", filepath.Join(root, "deploy", "helm", "carve"), "--out", out,
		"--component", monOut, "--rules", filepath.Join(monOut, "carve-rules.yaml"))
	// The monitoring component and the plain rule file are generated too.
	for generated, committed := range map[string]string{
		"monitoring.yaml":    "deploy/kubernetes/components/monitoring/monitoring.yaml",
		"kustomization.yaml": "deploy/kubernetes/components/monitoring/kustomization.yaml",
		"carve-rules.yaml":   "deploy/prometheus/carve-rules.yaml",
	} {
		want, err := os.ReadFile(filepath.Join(monOut, generated))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, committed))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s differs from what the chart renders (%v); edit the chart and run `make manifests`", committed, err)
		}
	}
	base := filepath.Join(root, "deploy", "kubernetes")
	fix := "edit the chart, not deploy/kubernetes, and run `make manifests`"
	written := map[string]bool{}
	for _, name := range filesUnder(t, out) {
		written[name] = true
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(base, name))
		if err != nil {
			t.Errorf("deploy/kubernetes/%s: %v; %s", name, err, fix)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/kubernetes/%s differs from what the chart renders; %s", name, fix)
		}
	}
	// Eight templates render with default values, plus kustomization.yaml;
	// snapshot-controller/ holds three CRDs, the controller and its
	// kustomization.yaml; components/node-channel-network-policy/ the
	// NetworkPolicy and its kustomization.yaml.
	if len(written) < 15 {
		t.Errorf("the generator wrote only %d files: %v", len(written), sortedKeys(written))
	}
	for _, name := range filesUnder(t, base) {
		if strings.HasPrefix(name, "components/") {
			continue // checked above
		}
		data, err := os.ReadFile(filepath.Join(base, name))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.HasPrefix(data, []byte("# Generated by `make manifests`")) && !written[name] {
			t.Errorf("deploy/kubernetes/%s is generated but no template renders it any more; %s", name, fix)
		}
		if !written[name] && name != "namespace.yaml" {
			t.Errorf("deploy/kubernetes/%s is neither generated nor namespace.yaml, the one hand-written file", name)
		}
	}

	// The base as kustomize builds it holds the chart's objects plus the
	// Namespace, nothing else (Helm needs the release namespace before it
	// installs, so the chart has none).
	differences := compareRenderings(t, byKey(t, renderKustomize(t)), byKey(t, renderChart(t)))
	var unexpected []string
	for _, d := range differences {
		k, found := strings.CutPrefix(d, "only in the kustomize base: ")
		if reason, ok := onlyInBase[k]; found && ok {
			t.Logf("expected difference: %s (%s)", d, reason)
			continue
		}
		unexpected = append(unexpected, d)
	}
	if len(unexpected) > 0 {
		t.Errorf("kustomize build and helm template differ:\n%s", strings.Join(unexpected, "\n"))
	}
}

// filesUnder lists the files under dir, as paths relative to it.
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		names = append(names, rel)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestChartOptions: the optional objects render from the very files in
// deploy/prometheus and deploy/grafana, and values reach the manifests.
func TestChartOptions(t *testing.T) {
	root := repoRoot(t)
	monitoring := []string{
		"metrics.serviceMonitor.enabled=true",
		"metrics.prometheusRule.enabled=true",
		"dashboard.enabled=true",
		"metrics.release=kube-prometheus-stack",
	}
	// Without prometheus-operator's API in the cluster, the chart renders
	// no ServiceMonitor or PrometheusRule (they would fail the install),
	// but still the dashboard.
	noCRDs := byKey(t, renderChart(t, monitoring...))
	for _, k := range []string{"ServiceMonitor carve-system/carve", "PrometheusRule carve-system/carve"} {
		if _, ok := noCRDs[k]; ok {
			t.Errorf("%s rendered although the cluster lacks monitoring.coreos.com/v1", k)
		}
	}
	if _, ok := noCRDs["ConfigMap carve-system/carve-dashboard"]; !ok {
		t.Error("no dashboard ConfigMap without monitoring.coreos.com/v1")
	}
	objs := byKey(t, renderChart(t, append(monitoring,
		"--api-versions=monitoring.coreos.com/v1",
		"node.maxVolumes=100",
		"kubeletDir=/data/kubelet",
		"metrics.service.enabled=false",
	)...))
	for _, o := range objs {
		switch o.kind() {
		case "ServiceMonitor", "PrometheusRule":
			// Not in client-go's scheme; checked against the files below.
		default:
			typed(t, o)
		}
	}
	for _, svc := range []string{"carve-node-metrics", "carve-provisioner-metrics", "carve-controller-metrics", "carve-resizer-metrics", "carve-snapshotter-metrics"} {
		if _, ok := objs["Service carve-system/"+svc]; ok {
			t.Errorf("metrics.service.enabled=false still renders the Service %s", svc)
		}
	}
	// kube-prometheus-stack selects both by its release label.
	for _, k := range []string{"ServiceMonitor carve-system/carve", "PrometheusRule carve-system/carve"} {
		md, _ := objs[k]["metadata"].(map[string]any)
		labels, _ := md["labels"].(map[string]any)
		if labels["release"] != "kube-prometheus-stack" {
			t.Errorf("%s labels %v lack release: kube-prometheus-stack", k, labels)
		}
		delete(labels, "release") // not in the plain files compared below
	}

	// The kustomize component holds the same ServiceMonitor,
	// PrometheusRule and dashboard ConfigMap: an overlay of the base with
	// the component, as docs/operations.md shows it, builds them.
	withComponent := byKey(t, renderWithComponent(t, "monitoring"))
	for _, key := range []string{"ServiceMonitor carve-system/carve", "PrometheusRule carve-system/carve", "ConfigMap carve-system/carve-dashboard"} {
		got, ok := withComponent[key]
		if !ok {
			t.Errorf("the base with components/monitoring lacks %s", key)
			continue
		}
		if d := compareRenderings(t, map[string]object{key: got}, map[string]object{key: objs[key]}); len(d) > 0 {
			t.Errorf("components/monitoring's %s differs from the chart's:\n%s", key, strings.Join(d, "\n"))
		}
	}
	cm := withComponent["ConfigMap carve-system/carve-dashboard"]
	if md, _ := cm["metadata"].(map[string]any); md != nil {
		if l, _ := md["labels"].(map[string]any); l["grafana_dashboard"] != "1" {
			t.Errorf("the dashboard ConfigMap's labels %v lack grafana_dashboard: \"1\"", l)
		}
	}

	// The PrometheusRule carries deploy/prometheus/carve-rules.yaml.
	rulesFile, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "carve-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules any
	if err := yaml.Unmarshal(rulesFile, &rules); err != nil {
		t.Fatal(err)
	}
	pr, ok := objs["PrometheusRule carve-system/carve"]
	if !ok {
		t.Fatal("no PrometheusRule rendered")
	}
	var d []string
	diff("spec", rules, pr["spec"], &d)
	if len(d) > 0 {
		t.Errorf("the PrometheusRule differs from deploy/prometheus/carve-rules.yaml:\n%s", strings.Join(d, "\n"))
	}

	// The dashboard ConfigMap carries deploy/grafana/carve-dashboard.json.
	dash, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "carve-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	dashCM, ok := objs["ConfigMap carve-system/carve-dashboard"]
	if !ok {
		t.Fatal("no dashboard ConfigMap rendered")
	}
	data, _ := dashCM["data"].(map[string]any)
	got, _ := data["carve-dashboard.json"].(string)
	if strings.TrimSpace(got) != strings.TrimSpace(string(dash)) {
		t.Error("the dashboard ConfigMap differs from deploy/grafana/carve-dashboard.json")
	}

	// Values reach the DaemonSet.
	ds, _ := json.Marshal(objs["DaemonSet carve-system/carve-node"])
	for _, want := range []string{
		`"--max-volumes=100"`,
		`"--kubelet-csi-socket=/data/kubelet/plugins/lvm.carve.dev/csi.sock"`,
		`"mountPath":"/data/kubelet"`,
		`"path":"/data/kubelet/plugins_registry"`,
	} {
		if !bytes.Contains(ds, []byte(want)) {
			t.Errorf("the DaemonSet rendered with options lacks %s", want)
		}
	}
}

// renderWithComponent builds an overlay of the kustomize base with one of
// its components (deploy/kubernetes/components/<name>), as
// docs/operations.md shows it.
func renderWithComponent(t *testing.T, name string) []object {
	t.Helper()
	root := repoRoot(t)
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, filepath.Join(root, "deploy", "kubernetes"))
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel +
		"\ncomponents:\n  - " + filepath.Join(rel, "components", name) + "\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	return decodeObjects(t, run(t, root, tool(t, "kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", overlay))
}

// sortFlags sorts the flags of every container of a workload (all but the
// first argument, the role): their order means nothing to carve, and a
// kustomize patch can only append.
func sortFlags(o object) {
	spec, _ := o["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pod, _ := tmpl["spec"].(map[string]any)
	containers, _ := pod["containers"].([]any)
	for _, c := range containers {
		cm, _ := c.(map[string]any)
		args, _ := cm["args"].([]any)
		if len(args) > 1 {
			slices.SortFunc(args[1:], func(a, b any) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
		}
	}
}

// TestComponentsMatchChart: each kustomize component over the base renders
// the same objects as the chart with the values that stand for it (the
// controller's flags compared as a set), and does what it is for. The
// control: the chart without those values differs from the component in
// every object the component changes.
func TestComponentsMatchChart(t *testing.T) {
	const deployment, daemonSet = "Deployment carve-system/carve-controller", "DaemonSet carve-system/carve-node"
	type holds struct {
		key, text string
		want      bool
	}
	tests := []struct {
		component string
		values    []string
		changes   []string // the objects the component adds, changes or removes
		holds     []holds  // what the component's rendering must (not) hold
	}{
		{
			component: "delete-claims-of-lost-nodes",
			values:    []string{"controller.deleteClaimsOfLostNodes=true"},
			changes:   []string{deployment, "ClusterRole /carve-controller-lost-nodes-delete", "ClusterRoleBinding /carve-controller-lost-nodes-delete"},
			holds:     []holds{{deployment, `"--delete-claims-of-lost-nodes"`, true}},
		},
		{
			component: "without-snapshots",
			values:    []string{"sidecars.snapshotter.enabled=false"},
			changes:   []string{deployment, "ClusterRole /carve-controller-snapshotter", "ClusterRoleBinding /carve-controller-snapshotter", "Service carve-system/carve-snapshotter-metrics"},
			holds:     []holds{{deployment, `"csi-snapshotter"`, false}, {deployment, `"csi-provisioner"`, true}, {daemonSet, `"carve"`, true}},
		},
		{
			// The chart renders its VolumeSnapshotClasses only where the
			// cluster serves the snapshot API; the component is that case.
			component: "snapshot-class",
			values:    []string{"--api-versions=snapshot.storage.k8s.io/v1"},
			changes:   []string{"VolumeSnapshotClass /carve"},
			holds:     []holds{{"VolumeSnapshotClass /carve", `"lvm.carve.dev"`, true}, {deployment, `"csi-snapshotter"`, true}},
		},
		{
			// Off by default: never run against the real sidecar. The
			// component's CA is a placeholder the API server refuses.
			component: "snapshot-metadata",
			values:    []string{"sidecars.snapshotMetadata.enabled=true", "sidecars.snapshotMetadata.tls.caCert=REPLACE-WITH-THE-BASE64-PEM-OF-THE-CA"},
			changes: []string{deployment, "Service carve-system/carve-snapshot-metadata", "SnapshotMetadataService /lvm.carve.dev",
				"ClusterRole /carve-controller-snapshot-metadata", "ClusterRoleBinding /carve-controller-snapshot-metadata"},
			holds: []holds{{deployment, `"csi-snapshot-metadata"`, true}, {deployment, `"carve-snapshot-metadata-tls"`, true},
				{"SnapshotMetadataService /lvm.carve.dev", `"carve-snapshot-metadata.carve-system:6443"`, true}},
		},
		{
			component: "node-channel-network-policy",
			values:    []string{"networkPolicy.enabled=true"},
			changes:   []string{"NetworkPolicy carve-system/carve-node-channel"},
			holds:     []holds{{"NetworkPolicy carve-system/carve-node-channel", `"node-channel"`, true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.component, func(t *testing.T) {
			component := byKey(t, renderWithComponent(t, tt.component))
			chartOn := byKey(t, renderChart(t, tt.values...))
			chartOff := byKey(t, renderChart(t))
			for _, objs := range []map[string]object{component, chartOn, chartOff} {
				if d, ok := objs[deployment]; ok {
					sortFlags(d)
				}
			}
			for _, h := range tt.holds {
				o, _ := json.Marshal(component[h.key])
				if got := bytes.Contains(o, []byte(h.text)); got != h.want {
					t.Errorf("the component's %s holds %s: %v, want %v", h.key, h.text, got, h.want)
				}
			}
			var unexpected []string
			for _, d := range compareRenderings(t, component, chartOn) {
				k, found := strings.CutPrefix(d, "only in the kustomize base: ")
				if _, ok := onlyInBase[k]; found && ok {
					continue
				}
				unexpected = append(unexpected, d)
			}
			if len(unexpected) > 0 {
				t.Errorf("the base with components/%s and the chart with %v differ:\n%s", tt.component, tt.values, strings.Join(unexpected, "\n"))
			}
			differs := map[string]bool{}
			for _, d := range compareRenderings(t, component, chartOff) {
				d = strings.TrimPrefix(strings.TrimPrefix(d, "only in the kustomize base: "), "only in the chart: ")
				for _, k := range tt.changes {
					if strings.HasPrefix(d, k) {
						differs[k] = true
					}
				}
			}
			for _, k := range tt.changes {
				if !differs[k] {
					t.Errorf("control: the chart without %v does not differ from the component in %s", tt.values, k)
				}
			}
		})
	}
}

// TestChartFilesAreCopies: the chart ships copies of the rule file and the
// dashboard (Helm cannot read files outside the chart); they must not drift.
func TestChartFilesAreCopies(t *testing.T) {
	root := repoRoot(t)
	for copyPath, orig := range map[string]string{
		"deploy/helm/carve/files/carve-dashboard.json": "deploy/grafana/carve-dashboard.json",
	} {
		a, err := os.ReadFile(filepath.Join(root, copyPath))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, orig))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: copy it again (cp %s %s)", copyPath, orig, orig, copyPath)
		}
	}
}
