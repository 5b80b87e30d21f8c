//go:build deploytest

package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// renderValues renders the chart with a values file; a failed render
// returns helm's error.
func renderValues(t *testing.T, values string) ([]object, error) {
	t.Helper()
	root := repoRoot(t)
	// Not in t.TempDir(): helm splits -f at commas, which subtest names
	// put into it.
	dir, err := os.MkdirTemp("", "carve-values")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	f := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(root, tool(t, "helm"), "template", "carve", filepath.Join(root, "deploy", "helm", "carve"),
		"--namespace", namespace, "--kube-version", kubeVersion, "-f", f)
	if err != nil {
		return nil, err
	}
	return decodeObjects(t, out), nil
}

// typedObjects decodes every rendered object strictly into its Go type.
func typedObjects(t *testing.T, objs []object) map[string]any {
	t.Helper()
	m := map[string]any{}
	for _, o := range objs {
		m[o.key()] = typed(t, o)
	}
	return m
}

func podSpecOf(t *testing.T, objs map[string]any, key string) (corev1.PodTemplateSpec, bool) {
	t.Helper()
	switch o := objs[key].(type) {
	case *appsv1.DaemonSet:
		return o.Spec.Template, true
	case *appsv1.Deployment:
		return o.Spec.Template, true
	}
	return corev1.PodTemplateSpec{}, false
}

func containerIn(t *testing.T, objs map[string]any, key, name string) corev1.Container {
	t.Helper()
	tmpl, ok := podSpecOf(t, objs, key)
	if !ok {
		t.Fatalf("no %s rendered", key)
	}
	return container(t, tmpl.Spec, name)
}

func hasEnv(c corev1.Container, name, value string) bool {
	return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name && e.Value == value })
}

const (
	nodeDS       = "DaemonSet carve-system/carve-node"
	controllerD  = "Deployment carve-system/carve-controller"
	controllerPD = "PodDisruptionBudget carve-system/carve-controller"
)

// TestChartValues: each option, turned on, renders what values.yaml says it
// does, and the result is still valid Kubernetes objects (strict decoding).
func TestChartValues(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values string
		check  func(t *testing.T, objs map[string]any)
	}{{
		name: "log level, JSON logs, extra args and env per container",
		values: `
logFormat: json
node: {logLevel: 4, extraArgs: [--lvm-timeout=5m], extraEnv: [{name: A, value: "1"}]}
controller: {logLevel: 3, extraArgs: [--driver-name=lvm.carve.dev], extraEnv: [{name: B, value: "2"}]}
sidecars:
  provisioner: {logLevel: 5, extraArgs: [--worker-threads=20], extraEnv: [{name: C, value: "3"}]}
  resizer: {logLevel: 2, extraArgs: [--timeout=3m], extraEnv: [{name: D, value: "4"}]}
`,
		check: func(t *testing.T, objs map[string]any) {
			for _, c := range []struct {
				key, container, v, arg, env, value string
			}{
				{nodeDS, "carve", "4", "--lvm-timeout=5m", "A", "1"},
				{controllerD, "csi-provisioner", "5", "--worker-threads=20", "C", "3"},
				{controllerD, "carve", "3", "--driver-name=lvm.carve.dev", "B", "2"},
				{controllerD, "csi-resizer", "2", "--timeout=3m", "D", "4"},
			} {
				ct := containerIn(t, objs, c.key, c.container)
				for _, want := range []string{"--v=" + c.v, "--logging-format=json", c.arg} {
					if !slices.Contains(ct.Args, want) {
						t.Errorf("%s: args %q lack %s", c.container, ct.Args, want)
					}
				}
				if !hasEnv(ct, c.env, c.value) {
					t.Errorf("%s: env %+v lacks %s=%s", c.container, ct.Env, c.env, c.value)
				}
			}
		},
	}, {
		name: "pod labels and annotations, priority class, resources, probes, security contexts",
		values: `
node:
  podLabels: {team: storage}
  podAnnotations: {example.com/a: x}
  priorityClassName: my-node-priority
  resources: {requests: {cpu: 200m}}
  livenessProbe: {httpGet: {path: /healthz, port: metrics}, periodSeconds: 7}
  readinessProbe: {httpGet: {path: /readyz, port: metrics}, periodSeconds: 3}
  podSecurityContext: {seccompProfile: {type: Unconfined}}
controller:
  podLabels: {team: storage}
  podAnnotations: {example.com/b: "y"}
  priorityClassName: my-priority
  podSecurityContext: {runAsNonRoot: true, runAsUser: 1000}
  replicas: 3
  podDisruptionBudget: {maxUnavailable: 0}
`,
		check: func(t *testing.T, objs map[string]any) {
			n, _ := podSpecOf(t, objs, nodeDS)
			c, _ := podSpecOf(t, objs, controllerD)
			if n.Labels["team"] != "storage" || c.Labels["team"] != "storage" || n.Annotations["example.com/a"] != "x" || c.Annotations["example.com/b"] != "y" {
				t.Errorf("pod labels %v %v, annotations %v %v", n.Labels, c.Labels, n.Annotations, c.Annotations)
			}
			if n.Spec.PriorityClassName != "my-node-priority" || c.Spec.PriorityClassName != "my-priority" {
				t.Errorf("priorityClassName %q %q", n.Spec.PriorityClassName, c.Spec.PriorityClassName)
			}
			plugin := container(t, n.Spec, "carve")
			if plugin.Resources.Requests.Cpu().String() != "200m" || plugin.LivenessProbe.PeriodSeconds != 7 || plugin.ReadinessProbe.PeriodSeconds != 3 {
				t.Errorf("plugin resources %v, probes %+v %+v", plugin.Resources, plugin.LivenessProbe, plugin.ReadinessProbe)
			}
			if n.Spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeUnconfined || *c.Spec.SecurityContext.RunAsUser != 1000 {
				t.Errorf("pod securityContexts %+v %+v", n.Spec.SecurityContext, c.Spec.SecurityContext)
			}
			if d := objs[controllerD].(*appsv1.Deployment); *d.Spec.Replicas != 3 {
				t.Errorf("replicas %d", *d.Spec.Replicas)
			}
			if p := objs[controllerPD].(*policyv1.PodDisruptionBudget); p.Spec.MaxUnavailable.IntValue() != 0 {
				t.Errorf("PDB maxUnavailable %v", p.Spec.MaxUnavailable)
			}
		},
	}, {
		name: "node selection and rollout",
		values: `
node:
  nodeSelector: {kubernetes.io/os: linux, example.com/disks: "true"}
  tolerations: [{key: dedicated, operator: Equal, value: db, effect: NoSchedule}]
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 3, maxSurge: 0}}
controller: {podDisruptionBudget: {enabled: false}}
`,
		check: func(t *testing.T, objs map[string]any) {
			ds := objs[nodeDS].(*appsv1.DaemonSet)
			s := ds.Spec.Template.Spec
			if s.NodeSelector["example.com/disks"] != "true" || len(s.Tolerations) != 1 || s.Tolerations[0].Key != "dedicated" {
				t.Errorf("nodeSelector %v, tolerations %+v", s.NodeSelector, s.Tolerations)
			}
			if ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntValue() != 3 {
				t.Errorf("updateStrategy %+v", ds.Spec.UpdateStrategy)
			}
			if _, ok := objs[controllerPD]; ok {
				t.Error("podDisruptionBudget.enabled=false still renders the PodDisruptionBudget")
			}
		},
	}, {
		name: "node channel and csi-provisioner metrics ports, no snapshotter, NetworkPolicy",
		values: `
node: {nodeChannelPort: 7000}
controller: {provisionerMetricsPort: 7001}
sidecars: {snapshotter: {enabled: false}}
networkPolicy: {enabled: true}
`,
		check: func(t *testing.T, objs map[string]any) {
			plugin := containerIn(t, objs, nodeDS, "carve")
			if got, _ := flagValue(plugin.Args, "--node-channel-address"); got != "$(POD_IP):7000" ||
				!slices.ContainsFunc(plugin.Ports, func(p corev1.ContainerPort) bool { return p.Name == "node-channel" && p.ContainerPort == 7000 }) {
				t.Errorf("node channel address %q, ports %+v; want port 7000", got, plugin.Ports)
			}
			if svc := objs["Service carve-system/carve-node"].(*corev1.Service); svc.Spec.Ports[0].Port != 7000 {
				t.Errorf("Service carve-node ports %+v, want 7000", svc.Spec.Ports)
			}
			prov := containerIn(t, objs, controllerD, "csi-provisioner")
			if got, _ := flagValue(prov.Args, "--http-endpoint"); got != ":7001" || prov.Ports[0].ContainerPort != 7001 {
				t.Errorf("csi-provisioner --http-endpoint=%q, ports %+v; want 7001", got, prov.Ports)
			}
			if svc := objs["Service carve-system/carve-provisioner-metrics"].(*corev1.Service); svc.Spec.Ports[0].Port != 7001 {
				t.Errorf("Service carve-provisioner-metrics ports %+v, want 7001", svc.Spec.Ports)
			}
			tmpl, _ := podSpecOf(t, objs, controllerD)
			for _, c := range tmpl.Spec.Containers {
				if c.Name == "csi-snapshotter" {
					t.Error("sidecars.snapshotter.enabled=false still runs csi-snapshotter")
				}
			}
			for _, k := range []string{"ClusterRole /carve-controller-snapshotter", "ClusterRoleBinding /carve-controller-snapshotter", "VolumeSnapshotClass /carve", "Service carve-system/carve-snapshotter-metrics"} {
				if _, ok := objs[k]; ok {
					t.Errorf("sidecars.snapshotter.enabled=false still renders %s", k)
				}
			}
			if _, ok := objs["NetworkPolicy carve-system/carve-node-channel"].(*networkingv1.NetworkPolicy); !ok {
				t.Errorf("networkPolicy.enabled=true renders no NetworkPolicy carve-node-channel: %v", sortedKeys(objs))
			}
		},
	}, {
		name: "csi-snapshotter metrics port",
		values: `
controller: {snapshotterMetricsPort: 7003}
`,
		check: func(t *testing.T, objs map[string]any) {
			snap := containerIn(t, objs, controllerD, "csi-snapshotter")
			if got, _ := flagValue(snap.Args, "--http-endpoint"); got != ":7003" || len(snap.Ports) != 1 || snap.Ports[0].ContainerPort != 7003 {
				t.Errorf("csi-snapshotter --http-endpoint=%q, ports %+v; want 7003", got, snap.Ports)
			}
			if svc := objs["Service carve-system/carve-snapshotter-metrics"].(*corev1.Service); svc.Spec.Ports[0].Port != 7003 {
				t.Errorf("Service carve-snapshotter-metrics ports %+v, want 7003", svc.Spec.Ports)
			}
		},
	}, {
		// An empty metricsFrom must leave the metrics rule out: a rule
		// with an empty "from" admits everyone.
		name: "NetworkPolicy: metrics port for nobody, then for another namespace",
		values: `
networkPolicy: {enabled: true, metricsFrom: []}
`,
		check: func(t *testing.T, objs map[string]any) {
			np := objs["NetworkPolicy carve-system/carve-node-channel"].(*networkingv1.NetworkPolicy)
			for _, r := range np.Spec.Ingress {
				if len(r.From) == 0 || slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.String() == "metrics" }) {
					t.Errorf("metricsFrom: [] renders ingress rule %+v; want only the node channel's", r)
				}
			}
		},
	}, {
		name: "NetworkPolicy: metrics port for a chosen namespace",
		values: `
networkPolicy:
  enabled: true
  metricsFrom: [{namespaceSelector: {matchLabels: {team: observability}}}]
`,
		check: func(t *testing.T, objs map[string]any) {
			np := objs["NetworkPolicy carve-system/carve-node-channel"].(*networkingv1.NetworkPolicy)
			last := np.Spec.Ingress[len(np.Spec.Ingress)-1]
			if len(last.From) != 1 || last.From[0].NamespaceSelector == nil || last.From[0].NamespaceSelector.MatchLabels["team"] != "observability" ||
				len(last.Ports) != 1 || last.Ports[0].Port.String() != "metrics" {
				t.Errorf("metrics rule %+v, want from the namespaces labelled team=observability", last)
			}
		},
	}, {
		name: "StorageClass mount options, labels, annotations, parameters",
		values: `
storageClasses:
  - name: db
    deviceClass: thick
    fsType: xfs
    default: true
    mountOptions: [noatime]
    labels: {team: db}
    annotations: {example.com/c: z}
    parameters: {csi.storage.k8s.io/node-stage-secret-name: q}
`,
		check: func(t *testing.T, objs map[string]any) {
			sc, ok := objs["StorageClass /db"].(*storagev1.StorageClass)
			if !ok {
				t.Fatalf("no StorageClass db: %v", sortedKeys(objs))
			}
			if !reflect.DeepEqual(sc.MountOptions, []string{"noatime"}) || sc.Labels["team"] != "db" ||
				sc.Annotations["example.com/c"] != "z" || sc.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" ||
				sc.Parameters["csi.storage.k8s.io/node-stage-secret-name"] != "q" || sc.Parameters["carve.dev/device-class"] != "thick" || sc.Parameters["csi.storage.k8s.io/fstype"] != "xfs" {
				t.Errorf("StorageClass %+v", sc)
			}
		},
	}, {
		name: "node groups: a DaemonSet and a ConfigMap per group, disjoint nodes",
		values: `
nodeGroups:
  - name: nvme
    deviceClasses: [{name: fast, volumeGroup: nvme, default: true}]
    tolerations: [{key: dedicated, operator: Exists}]
  - name: hdd
    deviceClasses: [{name: bulk, volumeGroup: hdd}]
storageClasses:
  - {name: fast, deviceClass: fast}
  - {name: bulk, deviceClass: bulk}
  - {name: thick, deviceClass: thick}
`,
		check: func(t *testing.T, objs map[string]any) {
			base := objs[nodeDS].(*appsv1.DaemonSet)
			for _, g := range []struct{ name, class string }{{"nvme", "fast"}, {"hdd", "bulk"}} {
				ds, ok := objs["DaemonSet carve-system/carve-node-"+g.name].(*appsv1.DaemonSet)
				if !ok {
					t.Fatalf("no DaemonSet for group %s: %v", g.name, sortedKeys(objs))
				}
				s := ds.Spec.Template.Spec
				if s.NodeSelector["carve.dev/node-group"] != g.name || s.NodeSelector["kubernetes.io/os"] != "linux" {
					t.Errorf("group %s: nodeSelector %v", g.name, s.NodeSelector)
				}
				// The selectors are disjoint: neither DaemonSet takes the
				// other's pods.
				if ds.Spec.Selector.MatchLabels["carve.dev/node-group"] != g.name || ds.Spec.Template.Labels["carve.dev/node-group"] != g.name {
					t.Errorf("group %s: selector %+v, pod labels %v", g.name, ds.Spec.Selector, ds.Spec.Template.Labels)
				}
				cm, ca := nodeConfigVolume(t, s)
				if cm != "carve-device-classes-"+g.name || !ca {
					t.Errorf("group %s mounts ConfigMap %q (and the CA bundle: %v)", g.name, cm, ca)
				}
				file := objs["ConfigMap carve-system/"+cm].(*corev1.ConfigMap).Data["config.yaml"]
				if !strings.Contains(file, "name: "+g.class) || strings.Contains(file, "name: thick") {
					t.Errorf("group %s's device-class file:\n%s", g.name, file)
				}
				if (g.name == "nvme") != (len(s.Tolerations) == 1) {
					t.Errorf("group %s: tolerations %+v", g.name, s.Tolerations)
				}
				// The same plugin and node channel as carve-node.
				got, want := container(t, s, "carve"), container(t, base.Spec.Template.Spec, "carve")
				for _, f := range []string{"--node-channel-address", "--node-channel-ca-file", "--node-channel-token-file", "--endpoint"} {
					gv, _ := flagValue(got.Args, f)
					wv, _ := flagValue(want.Args, f)
					if gv != wv || gv == "" {
						t.Errorf("group %s: %s=%q, carve-node's %q", g.name, f, gv, wv)
					}
				}
				if !reflect.DeepEqual(got.Ports, want.Ports) || !reflect.DeepEqual(s.Volumes[len(s.Volumes)-1], base.Spec.Template.Spec.Volumes[len(s.Volumes)-1]) {
					t.Errorf("group %s: ports %+v and token volume %+v differ from carve-node's", g.name, got.Ports, s.Volumes[len(s.Volumes)-1])
				}
			}
			// The objects of the defaults, a DaemonSet and a ConfigMap
			// per group, and three StorageClasses instead of two.
			defaults, err := renderValues(t, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != len(defaults)+2*2+1 {
				t.Errorf("%d objects: %v", len(objs), sortedKeys(objs))
			}
		},
	}, {
		name: "only node groups",
		values: `
node: {unlabelledNodes: false}
nodeGroups: [{name: nvme, deviceClasses: [{name: fast, volumeGroup: nvme}]}]
storageClasses: [{name: fast, deviceClass: fast}]
`,
		check: func(t *testing.T, objs map[string]any) {
			for _, k := range []string{nodeDS, "ConfigMap carve-system/carve-device-classes"} {
				if _, ok := objs[k]; ok {
					t.Errorf("unlabelledNodes=false still renders %s", k)
				}
			}
			if _, ok := objs["DaemonSet carve-system/carve-node-nvme"]; !ok {
				t.Error("no DaemonSet carve-node-nvme")
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rendered, err := renderValues(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, typedObjects(t, rendered))
		})
	}
}

// TestChartRejectsBadValues: a typo or an inconsistent value fails the
// install with a message naming it, instead of being ignored.
func TestChartRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, values, want string
	}{
		{"typo at the top", "imageTag: v1\n", "additional properties 'imageTag' not allowed"},
		{"typo in node", "node: {loglevel: 3}\n", "additional properties 'loglevel' not allowed"},
		{"typo in a device class", "deviceClasses: [{name: a, volumeGroup: vg, thinpool: p}]\nstorageClasses: []\n", "additional properties 'thinpool' not allowed"},
		{"log format", "logFormat: yaml\n", "logFormat"},
		{"unknown device class", "storageClasses: [{name: x, deviceClass: nope}]\n", `names device class "nope", which no node offers`},
		{"class of a disabled carve-node", "node: {unlabelledNodes: false}\n", `names device class "thick", which no node offers`},
		{"two groups, one name", "nodeGroups: [{name: a, deviceClasses: [{name: x, volumeGroup: v}]}, {name: a, deviceClasses: [{name: z, volumeGroup: v}]}]\n", `two groups are named "a"`},
		{"group name not a label value", "nodeGroups: [{name: A_B, deviceClasses: [{name: x, volumeGroup: v}]}]\n", "nodeGroups/0/name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := renderValues(t, tc.values)
			if err == nil {
				b, _ := json.Marshal(objs)
				t.Fatalf("helm template accepted %q and rendered %d bytes", tc.values, len(b))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template's error does not say %q:\n%v", tc.want, err)
			}
		})
	}
}

// TestKustomizeNodeGroups: kustomize users get node groups the way
// docs/install.md shows, through kustomize's own helmCharts field (the
// chart inflated by kustomize build --enable-helm) instead of a copied
// DaemonSet; their own patches apply on top.
func TestKustomizeNodeGroups(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	kustomization := `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
helmGlobals:
  chartHome: ` + filepath.Join(root, "deploy", "helm") + `
helmCharts:
  - name: carve
    releaseName: carve
    namespace: carve-system
    kubeVersion: ` + kubeVersion + `
    valuesInline:
      nodeGroups:
        - name: nvme
          deviceClasses: [{name: fast, volumeGroup: nvme, default: true}]
      storageClasses:
        - {name: carve-fast, deviceClass: fast}
patches:
  - target: {kind: DaemonSet, name: carve-node-nvme}
    patch: |
      - op: add
        path: /spec/template/spec/tolerations
        value: [{key: dedicated, operator: Exists}]
`
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o600); err != nil {
		t.Fatal(err)
	}
	// LoadRestrictionsNone only because the chart is this checkout's
	// rather than a release's (helmCharts' repo and version).
	out := run(t, root, tool(t, "kustomize"), "build", "--enable-helm", "--helm-command", tool(t, "helm"),
		"--load-restrictor", "LoadRestrictionsNone", dir)
	objs := typedObjects(t, decodeObjects(t, out))
	ds, ok := objs["DaemonSet carve-system/carve-node-nvme"].(*appsv1.DaemonSet)
	if !ok {
		t.Fatalf("no DaemonSet carve-node-nvme in %v", sortedKeys(objs))
	}
	if ds.Spec.Template.Spec.NodeSelector["carve.dev/node-group"] != "nvme" || len(ds.Spec.Template.Spec.Tolerations) != 1 {
		t.Errorf("carve-node-nvme: nodeSelector %v, tolerations %+v (patched)", ds.Spec.Template.Spec.NodeSelector, ds.Spec.Template.Spec.Tolerations)
	}
	for _, k := range []string{nodeDS, "ConfigMap carve-system/carve-device-classes-nvme", "StorageClass /carve-fast"} {
		if _, ok := objs[k]; !ok {
			t.Errorf("no %s in %v", k, sortedKeys(objs))
		}
	}
}

// TestNodeCopyPort: node.nodeCopyPort turns on copies across nodes, by
// default on 9811: the node agents get --node-copy-address on the pod's
// address and a port named node-copy, and the NetworkPolicy admits the
// node pods (and only them) to it; at 0 none of it is rendered.
func TestNodeCopyPort(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		port         int32
	}{
		{"default", "networkPolicy: {enabled: true}\n", 9811},
		{"another port", "networkPolicy: {enabled: true}\nnode: {nodeCopyPort: 9900}\n", 9900},
		{"off", "networkPolicy: {enabled: true}\nnode: {nodeCopyPort: 0}\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rendered, err := renderValues(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			objs := map[string]runtime.Object{}
			for _, o := range rendered {
				objs[o.key()] = typed(t, o)
			}
			ds := get[*appsv1.DaemonSet](t, objs, "DaemonSet carve-system/carve-node")
			c := ds.Spec.Template.Spec.Containers[0]
			on := tc.port != 0
			hasArg := slices.Contains(c.Args, fmt.Sprintf("--node-copy-address=$(POD_IP):%d", tc.port))
			hasAnyArg := slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--node-copy-address") })
			hasPort := slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "node-copy" && p.ContainerPort == tc.port })
			hasAnyPort := slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "node-copy" })
			if hasArg != on || hasPort != on || hasAnyArg != on || hasAnyPort != on {
				t.Errorf("container %s: --node-copy-address on %d %t (any: %t), port node-copy %d %t (any: %t); want %t",
					c.Name, tc.port, hasArg, hasAnyArg, tc.port, hasPort, hasAnyPort, on)
			}
			np := get[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy carve-system/carve-node-channel")
			var peers []networkingv1.NetworkPolicyPeer
			for _, r := range np.Spec.Ingress {
				for _, p := range r.Ports {
					if p.Port != nil && p.Port.String() == "node-copy" {
						peers = append(peers, r.From...)
					}
				}
			}
			nodePods := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"app.kubernetes.io/name": "carve", "app.kubernetes.io/component": "node"}}}
			if want := on; (len(peers) == 1 && reflect.DeepEqual(peers[0], nodePods)) != want || (!want && len(peers) > 0) {
				t.Errorf("the NetworkPolicy admits %+v to node-copy; want only the node pods: %t", peers, want)
			}
		})
	}
}
